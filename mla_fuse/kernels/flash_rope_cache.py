"""Fused MHA RoPE + flash paged-cache write (``rope_and_reshape_and_cache_flash``).

Formula, for every token ``t < T`` and pair ``j < R/2`` of a head's first ``R``
elements (NeoX: ``(j, j + R/2)``, GPT-J: ``(2j, 2j + 1)``),
``c, s = cos_sin_cache[positions[t], j], cos_sin_cache[positions[t], R/2 + j]``:

    query[t, h, pair] <- round(a*c - b*s), round(b*c + a*s)     (every query head, fp32 math)
    key[t, h, pair]   <- the same rotation                       (every KV head)
    if t < len(slot_mapping) and slot = slot_mapping[t] >= 0, for every KV head h:
        key_cache[slot // B, slot % B, h]   <- stored(key[t, h] rotated, k_scale[h])
        value_cache[slot // B, slot % B, h] <- stored(value[t, h],       v_scale[h])

Elements ``R..D`` of a head pass through (not rotated; copied to the cache).
``stored(x, scale)`` is ``x``'s bits or ``fp8(clamp(float32(x) / scale))``
with ``x`` the rotated key already rounded to the input dtype (the bits
written back to ``key``). Every row is rotated, padded or not.

Grid: ``(cdiv(T, BLOCK_TOKENS), G)``, ``G = cdiv(H, query_heads_per_program)``.
Program ``(i, g)`` handles tokens ``[i*BLOCK_TOKENS, +BLOCK_TOKENS)``, query
heads ``[g*query_heads_per_program, ...)`` and KV heads
``[g*kv_heads_per_program, ...)`` with ``kv_heads_per_program = cdiv(Hkv, G)``.

Operands (element strides; the innermost stride is 1 everywhere):
  positions     [T]               int32/int64    stride_position
  query         [T, H, D]         fp32/fp16/bf16 stride_query_token, stride_query_head
  key           [T, Hkv, D]       query dtype    stride_key_token, stride_key_head
  value         [T, Hkv, Dv]      query dtype    stride_value_token, stride_value_head
  cos_sin_cache [P, R]            fp32/in dtype  stride_cos_sin_position
  slot_mapping  [T' <= T]         int32/int64    stride_slot
  key_cache     [NB, B, Hkv, D]   in dtype, or uint8 codes for fp8   stride_key_cache_{block,entry,head}
  value_cache   [NB, B, Hkv, Dv]  as key_cache                      stride_value_cache_{block,entry,head}
  k_scale, v_scale  [1] or [Hkv]  fp32           stride_k_scale, stride_v_scale (0 for [1])

Compiled variants (docs/DESIGN.md): ``R/2``, the tail ``D - R`` and ``Dv`` are runtime values masked
inside the power-of-two tiles ``BLOCK_HALF``, ``BLOCK_TAIL``, ``BLOCK_VALUE_HEAD``; ``FULL_*`` says
a size fills its tile, and then the kernel uses the tile width itself (no mask, no clamp: the code
of a constexpr size; ``FULL_HEAD``: both ``R/2`` and the tail do, so ``D`` is ``2 * BLOCK_HALF +
BLOCK_TAIL``). Every argument is out of Triton's specialisation (``do_not_specialize`` and
``do_not_specialize_on_alignment``, all int64): no integer's value and no single pointer's alignment
makes a new kernel. What a GPU gains from alignment, 16-byte vector loads and stores, needs every
row aligned at once, so the launcher checks all of them (addresses, strides and in-row offsets of
query, key, value, the table and both caches; NeoX's second halves at ``R/2``, the tails at ``R``)
and passes one constexpr ``ALIGNED``; the kernel then marks its full tiles' pointers with
``tl.multiple_of``. Compiled variants: dtypes, formats, flags and tiles only.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from mla_fuse.kernels import EVERY_ARGUMENT, config, jit
from mla_fuse.kernels.conversions import FP8_FORMATS, quantize
from mla_fuse.kernels.indexing import cache_slots, head_range, store_heads, token_range
from mla_fuse.kernels.launcher import Launcher, Plan
from mla_fuse.kernels.rotation import load_cos_sin, rotate_in_place, store_pairs


@jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
def flash_rope_cache_kernel(
    # pointers
    positions_ptr, query_ptr, key_ptr, value_ptr, cos_sin_ptr, slot_mapping_ptr, key_cache_ptr, value_cache_ptr,
    k_scale_ptr, v_scale_ptr,
    # sizes
    num_tokens: tl.int64, num_query_heads: tl.int64, num_kv_heads: tl.int64, query_heads_per_program: tl.int64,
    kv_heads_per_program: tl.int64, num_slots: tl.int64, block_size: tl.int64, head_size: tl.int64,
    value_head_size: tl.int64, half: tl.int64,
    # strides
    stride_position: tl.int64, stride_query_token: tl.int64, stride_query_head: tl.int64,
    stride_key_token: tl.int64, stride_key_head: tl.int64, stride_value_token: tl.int64,
    stride_value_head: tl.int64, stride_cos_sin_position: tl.int64, stride_slot: tl.int64,
    stride_key_cache_block: tl.int64, stride_key_cache_entry: tl.int64, stride_key_cache_head: tl.int64,
    stride_value_cache_block: tl.int64, stride_value_cache_entry: tl.int64, stride_value_cache_head: tl.int64,
    stride_k_scale: tl.int64, stride_v_scale: tl.int64,
    # constexprs
    IS_NEOX: tl.constexpr, FP8_FORMAT: tl.constexpr, HAS_TAIL: tl.constexpr, BLOCK_TOKENS: tl.constexpr,
    BLOCK_QUERY_HEADS: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_TAIL: tl.constexpr, BLOCK_VALUE_HEAD: tl.constexpr, FULL_HALF: tl.constexpr, FULL_TAIL: tl.constexpr,
    FULL_HEAD: tl.constexpr, FULL_VALUE_HEAD: tl.constexpr, ALIGNED: tl.constexpr,
):
    # ---- sizes: a full tile's width is the constexpr itself
    half_width = BLOCK_HALF if FULL_HALF else half
    head_width = 2 * BLOCK_HALF + BLOCK_TAIL if FULL_HEAD else head_size
    value_head_width = BLOCK_VALUE_HEAD if FULL_VALUE_HEAD else value_head_size

    # ---- program id -> tokens and heads
    tokens, token_mask = token_range(num_tokens, BLOCK_TOKENS)
    head_block = tl.program_id(1)

    # ---- load position -> cos/sin  [BLOCK_TOKENS, 1, BLOCK_HALF], fp32
    cos, sin = load_cos_sin(positions_ptr, cos_sin_ptr, tokens, token_mask, stride_position, stride_cos_sin_position,
                            half_width, BLOCK_HALF, FULL_HALF, ALIGNED)

    # ---- rotate query[tokens, heads, :R] in place
    heads, head_mask = head_range(head_block, query_heads_per_program, num_query_heads, BLOCK_QUERY_HEADS)
    rows = query_ptr + tokens[:, None] * stride_query_token + heads[None, :] * stride_query_head
    rotate_in_place(rows, token_mask[:, None] & head_mask[None, :], cos, sin, half_width, BLOCK_HALF, FULL_HALF,
                    IS_NEOX, ALIGNED)

    # ---- rotate key[tokens, kv heads, :R] in place (every row, padded or not)
    kv_heads, kv_head_mask = head_range(head_block, kv_heads_per_program, num_kv_heads, BLOCK_KV_HEADS)
    rows = key_ptr + tokens[:, None] * stride_key_token + kv_heads[None, :] * stride_key_head
    k_pairs = rotate_in_place(rows, token_mask[:, None] & kv_head_mask[None, :], cos, sin, half_width, BLOCK_HALF,
                              FULL_HALF, IS_NEOX, ALIGNED)

    # ---- load slot -> cache entries (t < len(slot_mapping) and slot >= 0 only)
    block_index, block_offset, write = cache_slots(slot_mapping_ptr, tokens, token_mask, num_slots, stride_slot,
                                                   block_size)
    key_entries = block_index * stride_key_cache_block + block_offset * stride_key_cache_entry

    # ---- quantize (fp8: code = fp8(clamp(k / k_scale[h])), k rounded as written back) + store rotated key
    if FP8_FORMAT != 0:
        k_scale = tl.load(k_scale_ptr + kv_heads * stride_k_scale, mask=kv_head_mask, other=1.0)
        k_pairs = quantize(k_pairs, k_scale[None, :, None, None], FP8_FORMAT)
    key_rows = key_cache_ptr + key_entries[:, None] + kv_heads[None, :] * stride_key_cache_head
    store_pairs(key_rows, write[:, None] & kv_head_mask[None, :], k_pairs, half_width, BLOCK_HALF, FULL_HALF,
                IS_NEOX, ALIGNED)

    # ---- the unrotated tail key[..., R:D] and the value heads
    if HAS_TAIL:
        store_heads(key_ptr, key_cache_ptr, k_scale_ptr, tokens, kv_heads, write, kv_head_mask, stride_key_token,
                    stride_key_head, key_entries, stride_key_cache_head, stride_k_scale, 2 * half_width, head_width,
                    FP8_FORMAT, BLOCK_TAIL, FULL_TAIL, ALIGNED)
    store_heads(value_ptr, value_cache_ptr, v_scale_ptr, tokens, kv_heads, write, kv_head_mask, stride_value_token,
                stride_value_head, block_index * stride_value_cache_block + block_offset * stride_value_cache_entry,
                stride_value_cache_head, stride_v_scale, 0, value_head_width, FP8_FORMAT, BLOCK_VALUE_HEAD,
                FULL_VALUE_HEAD, ALIGNED)


@functools.lru_cache(config.LAUNCH_CACHE_SIZE)
def launch_config(num_tokens: int, num_query_heads: int, num_kv_heads: int, head_size: int, value_head_size: int,
                  rotary_dim: int, is_neox: bool, fp8_format: str | None) -> tuple[tuple, int, int, dict]:
    """(grid, query and KV heads per program, constexprs and options) of a layout; memoized (``config``)."""
    half, tail = rotary_dim // 2, head_size - rotary_dim
    query_heads_per_program = config.heads_per_program(num_query_heads, rotary_dim)
    num_head_blocks = max(config.cdiv(num_query_heads, query_heads_per_program), 1)  # KV heads need a program
    kv_heads_per_program = max(config.cdiv(num_kv_heads, num_head_blocks), 1)
    block_query_heads, block_kv_heads = config.block(query_heads_per_program), config.block(kv_heads_per_program)
    block_half, block_tail, block_value_head = config.block(half), config.block(tail), config.block(value_head_size)
    elements_per_token = block_query_heads * rotary_dim + block_kv_heads * (head_size + value_head_size)
    block_tokens = config.token_block(num_tokens, elements_per_token)
    tile_elements = block_query_heads * 2 * block_half + block_kv_heads * (2 * block_half + block_tail
                                                                            + block_value_head)
    grid = (config.cdiv(num_tokens, block_tokens), num_head_blocks)
    return grid, query_heads_per_program, kv_heads_per_program, config.Constexprs(
        IS_NEOX=is_neox, FP8_FORMAT=FP8_FORMATS[fp8_format], HAS_TAIL=tail > 0, BLOCK_TOKENS=block_tokens,
        BLOCK_QUERY_HEADS=block_query_heads, BLOCK_KV_HEADS=block_kv_heads, BLOCK_HALF=block_half,
        BLOCK_TAIL=block_tail, BLOCK_VALUE_HEAD=block_value_head, FULL_HALF=half == block_half,
        FULL_TAIL=tail == block_tail, FULL_HEAD=half == block_half and tail == block_tail,
        FULL_VALUE_HEAD=value_head_size == block_value_head,
        num_warps=config.num_warps(block_tokens * tile_elements), **config.COMPILE_OPTIONS)


#: the kernel's launches, Triton's per-call binding done once per layout (launcher.py)
launcher = Launcher(flash_rope_cache_kernel)
#: fp8 caches store code bits: the caches' positions among the kernel's arguments (``Plan.code_bits``)
FP8_CODE_BITS = launcher.positions("key_cache_ptr", "value_cache_ptr")


def launch(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
           key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
           cos_sin_cache: torch.Tensor, is_neox: bool, fp8_format: str | None, k_scale: torch.Tensor,
           v_scale: torch.Tensor, slot: list | None = None) -> None:
    """Launch on already validated arguments; strides come from the tensors as given. ``slot``:
    ``mla_fuse.layouts``' slot for these arguments' layout, where their launch plan is kept
    (``config.planned``)."""
    plan = config.planned(slot, _plan, positions, query, key, value, key_cache, value_cache, slot_mapping,
                          cos_sin_cache, is_neox, fp8_format, k_scale, v_scale)
    if plan:
        launcher(plan, positions, query, key, value, cos_sin_cache, slot_mapping, key_cache, value_cache, k_scale,
                 v_scale)


def _plan(positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, is_neox, fp8_format,
          k_scale, v_scale) -> Plan | tuple:
    """The launch's ``Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``); () when there is nothing to launch."""
    num_tokens, num_query_heads, head_size = query.shape
    num_kv_heads, value_head_size = key.size(1), value.size(2)
    rotary_dim = cos_sin_cache.size(1)
    if num_tokens == 0:
        return ()
    grid, query_heads_per_program, kv_heads_per_program, constexprs = launch_config(
        num_tokens, num_query_heads, num_kv_heads, head_size, value_head_size, rotary_dim, bool(is_neox), fp8_format)
    half = rotary_dim // 2
    # row starts, NeoX second halves (R/2) and the unrotated tails (R) on 16-byte boundaries
    inner = (half if is_neox else 0) | rotary_dim
    stride_query, stride_key, stride_value = query.stride(), key.stride(), value.stride()
    stride_table = cos_sin_cache.stride()
    stride_key_cache, stride_value_cache = key_cache.stride(), value_cache.stride()
    aligned = config.aligned(
        query.data_ptr(), key.data_ptr(), value.data_ptr(), cos_sin_cache.data_ptr(), key_cache.data_ptr(),
        value_cache.data_ptr(),
        query.element_size() * (stride_query[0] | stride_query[1] | stride_key[0] | stride_key[1] | stride_value[0]
                                | stride_value[1] | inner),
        cos_sin_cache.element_size() * (stride_table[0] | half),
        key_cache.element_size() * (stride_key_cache[0] | stride_key_cache[1] | stride_key_cache[2]
                                    | stride_value_cache[0] | stride_value_cache[1] | stride_value_cache[2] | inner))
    return Plan(grid, (
        num_tokens, num_query_heads, num_kv_heads, query_heads_per_program, kv_heads_per_program,
        slot_mapping.size(0), key_cache.size(1), head_size, value_head_size, half,
        positions.stride(0), stride_query[0], stride_query[1], stride_key[0], stride_key[1],
        stride_value[0], stride_value[1], stride_table[0], slot_mapping.stride(0),
        *stride_key_cache[:3], *stride_value_cache[:3],
        config.scale_stride(k_scale), config.scale_stride(v_scale),
    ), constexprs, aligned, code_bits=() if fp8_format is None else FP8_CODE_BITS)
