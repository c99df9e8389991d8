"""MLA paged-cache write (``concat_and_cache_mla``).

Formula, for every token ``t < len(slot_mapping)`` with ``slot = slot_mapping[t] >= 0``:

    kv_cache[slot // B, slot % B] <- [ stored(kv_c[t]) (L) | stored(k_pe[t]) (R) ]

``stored(x)`` is ``x``'s bits (``auto``/named caches) or
``fp8(clamp(float32(x) / scale))`` (fp8 caches). Padded slots (``< 0``) and
tokens past ``len(slot_mapping)`` write nothing.

Grid: ``(cdiv(len(slot_mapping), BLOCK_TOKENS),)``; program ``i`` writes the
entries of tokens ``[i*BLOCK_TOKENS, +BLOCK_TOKENS)``.

Operands (element strides; the innermost stride is 1 everywhere):
  kv_c          [T, L]           in dtype      stride_kv_c_token   (often kv[:, :L])
  k_pe          [T, R]           in dtype      stride_k_token      (often kv[:, L:])
  slot_mapping  [T' <= T]        int32/int64   stride_slot
  kv_cache      [NB, B, L + R]   in dtype, or uint8 codes for fp8   stride_cache_block, stride_cache_entry
  scale         [1]              fp32

Compiled variants (docs/DESIGN.md): the sizes ``L`` and ``R`` are runtime values masked inside the
power-of-two tiles ``BLOCK_LATENT`` and ``BLOCK_ROTARY``; ``FULL_*`` says a size fills its tile, and
then the kernel uses the tile width itself (no mask, no clamp: the code of a constexpr size). Every
argument is out of Triton's specialisation (``do_not_specialize`` and
``do_not_specialize_on_alignment``, all int64): no integer's value and no single pointer's alignment
makes a new kernel. What a GPU gains from alignment, 16-byte vector loads and stores, needs every
row aligned at once, so the launcher checks all of them (addresses, strides and in-row offsets of
``kv_c``, ``k_pe`` and the cache; ``k_pe`` lands at ``L`` in the entry) and passes one constexpr
``ALIGNED``; the kernel then marks its full tiles' pointers with ``tl.multiple_of``. Compiled
variants: dtypes, formats, flags and tiles only.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from mla_fuse.kernels import EVERY_ARGUMENT, config, jit
from mla_fuse.kernels.conversions import FP8_FORMATS, quantize
from mla_fuse.kernels.indexing import cache_slots, entry_rows, token_range
from mla_fuse.kernels.launcher import Launcher, Plan


@jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
def mla_cache_kernel(
    # pointers
    kv_c_ptr, k_pe_ptr, slot_mapping_ptr, kv_cache_ptr, scale_ptr,
    # sizes
    num_slots: tl.int64, block_size: tl.int64, latent_dim: tl.int64, rotary_dim: tl.int64,
    # strides
    stride_kv_c_token: tl.int64, stride_k_token: tl.int64, stride_slot: tl.int64, stride_cache_block: tl.int64,
    stride_cache_entry: tl.int64,
    # constexprs
    FP8_FORMAT: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_LATENT: tl.constexpr, BLOCK_ROTARY: tl.constexpr,
    FULL_LATENT: tl.constexpr, FULL_ROTARY: tl.constexpr, ALIGNED: tl.constexpr,
):
    # ---- sizes: a full tile's width is the constexpr itself
    latent_width = BLOCK_LATENT if FULL_LATENT else latent_dim
    rotary_width = BLOCK_ROTARY if FULL_ROTARY else rotary_dim

    # ---- program id -> tokens
    tokens, token_mask = token_range(num_slots, BLOCK_TOKENS)

    # ---- load slot -> cache entry (slot >= 0 only)
    block_index, block_offset, write = cache_slots(slot_mapping_ptr, tokens, token_mask, num_slots, stride_slot,
                                                   block_size)
    entries = block_index * stride_cache_block + block_offset * stride_cache_entry  # int64 [BLOCK_TOKENS]

    # ---- load kv_c [BLOCK_TOKENS, BLOCK_LATENT] and k_pe [BLOCK_TOKENS, BLOCK_ROTARY]
    kv_c_ptrs, latent_ptrs, latent_mask = entry_rows(kv_c_ptr, kv_cache_ptr, tokens, entries, write,
                                                     stride_kv_c_token, 0, latent_width, BLOCK_LATENT,
                                                     FULL_LATENT, ALIGNED)
    kv_c = tl.load(kv_c_ptrs, mask=latent_mask)
    k_pe_ptrs, rotary_ptrs, rotary_mask = entry_rows(k_pe_ptr, kv_cache_ptr, tokens, entries, write, stride_k_token,
                                                     latent_width, rotary_width, BLOCK_ROTARY, FULL_ROTARY, ALIGNED)
    k_pe = tl.load(k_pe_ptrs, mask=rotary_mask)

    # ---- quantize (fp8 caches): code = fp8(clamp(x / scale))
    if FP8_FORMAT != 0:
        scale = tl.load(scale_ptr)
        kv_c = quantize(kv_c, scale, FP8_FORMAT)
        k_pe = quantize(k_pe, scale, FP8_FORMAT)

    # ---- store the entry [kv_c (L) | k_pe (R)]
    tl.store(latent_ptrs, kv_c, mask=latent_mask)
    tl.store(rotary_ptrs, k_pe, mask=rotary_mask)


@functools.lru_cache(config.LAUNCH_CACHE_SIZE)
def launch_config(num_slots: int, latent_dim: int, rotary_dim: int, fp8_format: str | None) -> tuple[tuple, dict]:
    """(grid, constexprs and options) of a layout; memoized (``config``)."""
    block_tokens = config.token_block(num_slots, latent_dim + rotary_dim)
    block_latent, block_rotary = config.block(latent_dim), config.block(rotary_dim)
    return (config.cdiv(num_slots, block_tokens),), config.Constexprs(
        FP8_FORMAT=FP8_FORMATS[fp8_format], BLOCK_TOKENS=block_tokens, BLOCK_LATENT=block_latent,
        BLOCK_ROTARY=block_rotary, FULL_LATENT=latent_dim == block_latent, FULL_ROTARY=rotary_dim == block_rotary,
        num_warps=config.num_warps(block_tokens * (block_latent + block_rotary)), **config.COMPILE_OPTIONS)


#: the kernel's launches, Triton's per-call binding done once per layout (launcher.py)
launcher = Launcher(mla_cache_kernel)
#: an fp8 cache stores code bits: the cache's position among the kernel's arguments (``Plan.code_bits``)
FP8_CODE_BITS = launcher.positions("kv_cache_ptr")


def launch(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
           fp8_format: str | None, scale: torch.Tensor, slot: list | None = None) -> None:
    """Launch on already validated arguments; strides come from the tensors as given. ``slot``:
    ``mla_fuse.layouts``' slot for these arguments' layout, where their launch plan is kept
    (``config.planned``)."""
    plan = config.planned(slot, _plan, kv_c, k_pe, kv_cache, slot_mapping, fp8_format)
    if plan:
        launcher(plan, kv_c, k_pe, slot_mapping, kv_cache, scale)


def _plan(kv_c, k_pe, kv_cache, slot_mapping, fp8_format) -> Plan | tuple:
    """The launch's ``Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``); () when there is nothing to launch."""
    num_slots = slot_mapping.size(0)
    latent_dim, rotary_dim = kv_c.size(1), k_pe.size(1)
    if num_slots == 0:
        return ()
    grid, constexprs = launch_config(num_slots, latent_dim, rotary_dim, fp8_format)
    stride_kv_c, stride_k, stride_cache = kv_c.stride(), k_pe.stride(), kv_cache.stride()
    aligned = config.aligned(kv_c.data_ptr(), k_pe.data_ptr(), kv_cache.data_ptr(),
                             kv_c.element_size() * (stride_kv_c[0] | stride_k[0]),
                             kv_cache.element_size() * (stride_cache[0] | stride_cache[1] | latent_dim))
    return Plan(grid, (
        num_slots, kv_cache.size(1), latent_dim, rotary_dim,
        stride_kv_c[0], stride_k[0], slot_mapping.stride(0), stride_cache[0], stride_cache[1],
    ), constexprs, aligned, code_bits=() if fp8_format is None else FP8_CODE_BITS)
