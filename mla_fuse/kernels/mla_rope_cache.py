"""Fused MLA RoPE + paged-cache write (``concat_and_cache_mla_rope_fused``).

Formula, for every token ``t < T`` and pair ``j < R/2`` (NeoX: ``(j, j + R/2)``,
GPT-J: ``(2j, 2j + 1)``), ``c, s = cos_sin_cache[positions[t], j], [.., R/2 + j]``:

    q_pe[t, h, pair] <- round(a*c - b*s), round(b*c + a*s)     (every head h, fp32 math)
    k_pe[t, pair]    <- the same rotation of k_pe[t]
    if t < len(slot_mapping) and slot = slot_mapping[t] >= 0:
        kv_cache[slot // B, slot % B] <- [ stored(kv_c[t]) (L) | stored(k_pe[t] rotated) (R) ]

``stored(x)`` is ``x``'s bits (``auto``/named caches) or
``fp8(clamp(float32(x) / scale))`` (fp8 caches), with ``x`` the rotated k
already rounded to the input dtype: the same bits written back to ``k_pe``.
Every row is rotated, padded or not.

Grid: ``(cdiv(T, BLOCK_TOKENS), cdiv(H, heads_per_program))``. Program
``(i, g)`` rotates ``q_pe`` for tokens ``[i*BLOCK_TOKENS, +BLOCK_TOKENS)`` and
heads of block ``g``; programs with ``g == 0`` also rotate ``k_pe`` and write
the cache for their tokens.

Operands (element strides; the innermost stride is 1 everywhere):
  positions     [T]              int32/int64   stride_position
  q_pe          [T, H, R]        in dtype      stride_q_token, stride_q_head   (often q[..., nope:])
  k_pe          [T, R]           in dtype      stride_k_token                  (often kv[:, L:])
  kv_c          [T, L]           in dtype      stride_kv_c_token               (often kv[:, :L])
  cos_sin_cache [P, R]           fp32/in dtype stride_cos_sin_position
  slot_mapping  [T' <= T]        int32/int64   stride_slot
  kv_cache      [NB, B, L + R]   in dtype, or uint8 codes for fp8   stride_cache_block, stride_cache_entry
  scale         [1]              fp32

Compiled variants (docs/DESIGN.md): the sizes ``L`` and ``R/2`` are runtime values masked inside the
power-of-two tiles ``BLOCK_LATENT`` and ``BLOCK_HALF``; ``FULL_*`` says a size fills its tile, and
then the kernel uses the tile width itself (no mask, no clamp: the code of a constexpr size). Every
argument is out of Triton's specialisation (``do_not_specialize`` and
``do_not_specialize_on_alignment``, all int64): no integer's value and no single pointer's alignment
makes a new kernel. What a GPU gains from alignment, 16-byte vector loads and stores, needs every
row aligned at once, so the launcher checks all of them (addresses, strides and in-row offsets of
``q_pe``, ``k_pe``, ``kv_c``, the table and the cache; ``k_pe`` lands at ``L`` in the entry, NeoX's
second halves at ``R/2``) and passes one constexpr ``ALIGNED``; the kernel then marks its full
tiles' pointers with ``tl.multiple_of``. Compiled variants: dtypes, formats, flags and tiles only.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from mla_fuse.kernels import EVERY_ARGUMENT, config, jit
from mla_fuse.kernels.conversions import FP8_FORMATS, quantize
from mla_fuse.kernels.indexing import cache_slots, entry_rows, head_range, token_range
from mla_fuse.kernels.launcher import Launcher, Plan
from mla_fuse.kernels.rotation import load_cos_sin, rotate_in_place, store_pairs


@jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
def mla_rope_cache_kernel(
    # pointers
    positions_ptr, q_pe_ptr, k_pe_ptr, kv_c_ptr, cos_sin_ptr, slot_mapping_ptr, kv_cache_ptr, scale_ptr,
    # sizes
    num_tokens: tl.int64, num_heads: tl.int64, heads_per_program: tl.int64, num_slots: tl.int64,
    block_size: tl.int64, latent_dim: tl.int64, half: tl.int64,
    # strides
    stride_position: tl.int64, stride_q_token: tl.int64, stride_q_head: tl.int64, stride_k_token: tl.int64,
    stride_kv_c_token: tl.int64, stride_cos_sin_position: tl.int64, stride_slot: tl.int64,
    stride_cache_block: tl.int64, stride_cache_entry: tl.int64,
    # constexprs
    IS_NEOX: tl.constexpr, FP8_FORMAT: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_HEADS: tl.constexpr,
    BLOCK_LATENT: tl.constexpr, BLOCK_HALF: tl.constexpr, FULL_LATENT: tl.constexpr, FULL_HALF: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    # ---- sizes: a full tile's width is the constexpr itself
    latent_width = BLOCK_LATENT if FULL_LATENT else latent_dim
    half_width = BLOCK_HALF if FULL_HALF else half

    # ---- program id -> tokens and heads
    tokens, token_mask = token_range(num_tokens, BLOCK_TOKENS)
    head_block = tl.program_id(1)
    heads, head_mask = head_range(head_block, heads_per_program, num_heads, BLOCK_HEADS)

    # ---- load position -> cos/sin  [BLOCK_TOKENS, 1, BLOCK_HALF], fp32
    cos, sin = load_cos_sin(positions_ptr, cos_sin_ptr, tokens, token_mask, stride_position, stride_cos_sin_position,
                            half_width, BLOCK_HALF, FULL_HALF, ALIGNED)

    # ---- rotate q_pe[tokens, heads] in place
    q_rows = q_pe_ptr + tokens[:, None] * stride_q_token + heads[None, :] * stride_q_head
    rotate_in_place(q_rows, token_mask[:, None] & head_mask[None, :], cos, sin, half_width, BLOCK_HALF, FULL_HALF,
                    IS_NEOX, ALIGNED)

    if head_block == 0:
        # ---- rotate k_pe[tokens] in place (every row, padded or not): pairs [BLOCK_TOKENS, 1, BLOCK_HALF, 2]
        k_rows = k_pe_ptr + tokens[:, None] * stride_k_token
        k_pairs = rotate_in_place(k_rows, token_mask[:, None], cos, sin, half_width, BLOCK_HALF, FULL_HALF, IS_NEOX,
                                  ALIGNED)

        # ---- load slot -> cache entry (t < len(slot_mapping) and slot >= 0 only)
        block_index, block_offset, write = cache_slots(slot_mapping_ptr, tokens, token_mask, num_slots, stride_slot,
                                                       block_size)
        entries = block_index * stride_cache_block + block_offset * stride_cache_entry  # int64 [BLOCK_TOKENS]

        # ---- quantize (fp8 caches: code = fp8(clamp(x / scale))) of kv_c and of the rounded rotated k_pe
        kv_c_ptrs, latent_ptrs, latent_mask = entry_rows(kv_c_ptr, kv_cache_ptr, tokens, entries, write,
                                                         stride_kv_c_token, 0, latent_width, BLOCK_LATENT,
                                                         FULL_LATENT, ALIGNED)
        kv_c = tl.load(kv_c_ptrs, mask=latent_mask)
        if FP8_FORMAT != 0:
            scale = tl.load(scale_ptr)
            kv_c = quantize(kv_c, scale, FP8_FORMAT)
            k_pairs = quantize(k_pairs, scale, FP8_FORMAT)

        # ---- store the entry [kv_c (L) | rotated k_pe (R)]
        tl.store(latent_ptrs, kv_c, mask=latent_mask)
        store_pairs(kv_cache_ptr + (entries + latent_width)[:, None], write[:, None], k_pairs, half_width, BLOCK_HALF,
                    FULL_HALF, IS_NEOX, ALIGNED)


@functools.lru_cache(config.LAUNCH_CACHE_SIZE)
def launch_config(num_tokens: int, num_heads: int, rotary_dim: int, latent_dim: int, is_neox: bool,
                  fp8_format: str | None) -> tuple[tuple, int, dict]:
    """(grid, heads per program, constexprs and options) of a layout; memoized (``config``)."""
    half = rotary_dim // 2
    heads_per_program = config.heads_per_program(num_heads, rotary_dim)
    block_heads = config.block(heads_per_program)
    block_latent, block_half = config.block(latent_dim), config.block(half)
    block_tokens = config.token_block(num_tokens, block_heads * rotary_dim + latent_dim + rotary_dim)
    # head block 0 also rotates k_pe and writes the cache, so there is one even without query heads
    grid = (config.cdiv(num_tokens, block_tokens), max(config.cdiv(num_heads, heads_per_program), 1))
    return grid, heads_per_program, config.Constexprs(
        IS_NEOX=is_neox, FP8_FORMAT=FP8_FORMATS[fp8_format], BLOCK_TOKENS=block_tokens, BLOCK_HEADS=block_heads,
        BLOCK_LATENT=block_latent, BLOCK_HALF=block_half, FULL_LATENT=latent_dim == block_latent,
        FULL_HALF=half == block_half, num_warps=config.num_warps(block_tokens * block_heads * 2 * block_half),
        **config.COMPILE_OPTIONS)


#: the kernel's launches, Triton's per-call binding done once per layout (launcher.py)
launcher = Launcher(mla_rope_cache_kernel)
#: an fp8 cache stores code bits: the cache's position among the kernel's arguments (``Plan.code_bits``)
FP8_CODE_BITS = launcher.positions("kv_cache_ptr")


def launch(positions: torch.Tensor, q_pe: torch.Tensor, k_pe: torch.Tensor, kv_c: torch.Tensor,
           cos_sin_cache: torch.Tensor, is_neox: bool, slot_mapping: torch.Tensor, kv_cache: torch.Tensor,
           fp8_format: str | None, scale: torch.Tensor, slot: list | None = None) -> None:
    """Launch on already validated arguments; strides come from the tensors as given. ``slot``:
    ``mla_fuse.layouts``' slot for these arguments' layout, where their launch plan is kept
    (``config.planned``)."""
    plan = config.planned(slot, _plan, positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                          kv_cache, fp8_format)
    if plan:
        launcher(plan, positions, q_pe, k_pe, kv_c, cos_sin_cache, slot_mapping, kv_cache, scale)


def _plan(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, fp8_format) -> Plan | tuple:
    """The launch's ``Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``); () when there is nothing to launch."""
    num_tokens, num_heads, rotary_dim = q_pe.shape
    latent_dim = kv_c.size(1)
    if num_tokens == 0:
        return ()
    grid, heads_per_program, constexprs = launch_config(num_tokens, num_heads, rotary_dim, latent_dim, bool(is_neox),
                                                        fp8_format)
    half = rotary_dim // 2
    neox_half = half if is_neox else 0  # NeoX rows also move their second half as vectors
    stride_q, stride_k, stride_kv_c = q_pe.stride(), k_pe.stride(), kv_c.stride()
    stride_table, stride_cache = cos_sin_cache.stride(), kv_cache.stride()
    aligned = config.aligned(
        q_pe.data_ptr(), k_pe.data_ptr(), kv_c.data_ptr(), cos_sin_cache.data_ptr(), kv_cache.data_ptr(),
        q_pe.element_size() * (stride_q[0] | stride_q[1] | stride_k[0] | stride_kv_c[0] | neox_half),
        cos_sin_cache.element_size() * (stride_table[0] | half),
        kv_cache.element_size() * (stride_cache[0] | stride_cache[1] | latent_dim | neox_half))
    return Plan(grid, (
        num_tokens, num_heads, heads_per_program, slot_mapping.size(0), kv_cache.size(1), latent_dim, half,
        positions.stride(0), stride_q[0], stride_q[1], stride_k[0], stride_kv_c[0],
        stride_table[0], slot_mapping.stride(0), stride_cache[0], stride_cache[1],
    ), constexprs, aligned, code_bits=() if fp8_format is None else FP8_CODE_BITS)
