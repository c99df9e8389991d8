"""MHA (flash layout) paged-cache write (``reshape_and_cache_flash``).

Formula, for every token ``t < len(slot_mapping)`` with ``slot = slot_mapping[t] >= 0``
and every KV head ``h``:

    key_cache[slot // B, slot % B, h]   <- stored(key[t, h],   k_scale[h])
    value_cache[slot // B, slot % B, h] <- stored(value[t, h], v_scale[h])

``stored(x, scale)`` is ``x``'s bits (``auto``/named caches) or
``fp8(clamp(float32(x) / scale))`` (fp8 caches); a ``[1]`` scale serves every
head (stride 0). Padded slots (``< 0``) and tokens past ``len(slot_mapping)``
write nothing.

Grid: ``(cdiv(len(slot_mapping), BLOCK_TOKENS), cdiv(Hkv, kv_heads_per_program))``.

Operands (element strides; the innermost stride is 1 everywhere):
  key          [T, Hkv, D]       in dtype      stride_key_token, stride_key_head
  value        [T, Hkv, Dv]      in dtype      stride_value_token, stride_value_head
  slot_mapping [T' <= T]         int32/int64   stride_slot
  key_cache    [NB, B, Hkv, D]   in dtype, or uint8 codes for fp8   stride_key_cache_{block,entry,head}
  value_cache  [NB, B, Hkv, Dv]  as key_cache                      stride_value_cache_{block,entry,head}
  k_scale, v_scale  [1] or [Hkv] fp32          stride_k_scale, stride_v_scale (0 for [1])

Compiled variants (docs/DESIGN.md): the head sizes ``D`` and ``Dv`` are runtime values masked inside
the power-of-two tiles ``BLOCK_HEAD`` and ``BLOCK_VALUE_HEAD``; ``FULL_*`` says a size fills its
tile, and then the kernel uses the tile width itself (no mask, no clamp: the code of a constexpr
size). Every argument is out of Triton's specialisation (``do_not_specialize`` and
``do_not_specialize_on_alignment``, all int64): no integer's value and no single pointer's alignment
makes a new kernel. What a GPU gains from alignment, 16-byte vector loads and stores, needs every
row aligned at once, so the launcher checks all of them (addresses, strides and in-row offsets of
key, value and both caches) and passes one constexpr ``ALIGNED``; the kernel then marks its full
tiles' pointers with ``tl.multiple_of``. Compiled variants: dtypes, formats, flags and tiles only.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from mla_fuse.kernels import EVERY_ARGUMENT, config, jit
from mla_fuse.kernels.conversions import FP8_FORMATS
from mla_fuse.kernels.indexing import cache_slots, head_range, store_heads, token_range
from mla_fuse.kernels.launcher import Launcher, Plan


@jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
def flash_cache_kernel(
    # pointers
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr, k_scale_ptr, v_scale_ptr,
    # sizes
    num_slots: tl.int64, num_kv_heads: tl.int64, kv_heads_per_program: tl.int64, block_size: tl.int64,
    head_size: tl.int64, value_head_size: tl.int64,
    # strides
    stride_key_token: tl.int64, stride_key_head: tl.int64, stride_value_token: tl.int64, stride_value_head: tl.int64,
    stride_slot: tl.int64, stride_key_cache_block: tl.int64, stride_key_cache_entry: tl.int64,
    stride_key_cache_head: tl.int64, stride_value_cache_block: tl.int64, stride_value_cache_entry: tl.int64,
    stride_value_cache_head: tl.int64, stride_k_scale: tl.int64, stride_v_scale: tl.int64,
    # constexprs
    FP8_FORMAT: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr, BLOCK_HEAD: tl.constexpr,
    BLOCK_VALUE_HEAD: tl.constexpr, FULL_HEAD: tl.constexpr, FULL_VALUE_HEAD: tl.constexpr, ALIGNED: tl.constexpr,
):
    # ---- sizes: a full tile's width is the constexpr itself
    head_width = BLOCK_HEAD if FULL_HEAD else head_size
    value_head_width = BLOCK_VALUE_HEAD if FULL_VALUE_HEAD else value_head_size

    # ---- program id -> tokens and KV heads
    tokens, token_mask = token_range(num_slots, BLOCK_TOKENS)
    heads, head_mask = head_range(tl.program_id(1), kv_heads_per_program, num_kv_heads, BLOCK_KV_HEADS)

    # ---- load slot -> cache entries (slot >= 0 only)
    block_index, block_offset, write = cache_slots(slot_mapping_ptr, tokens, token_mask, num_slots, stride_slot,
                                                   block_size)

    # ---- quantize (fp8) + store key and value heads
    store_heads(key_ptr, key_cache_ptr, k_scale_ptr, tokens, heads, write, head_mask, stride_key_token,
                stride_key_head, block_index * stride_key_cache_block + block_offset * stride_key_cache_entry,
                stride_key_cache_head, stride_k_scale, 0, head_width, FP8_FORMAT, BLOCK_HEAD, FULL_HEAD, ALIGNED)
    store_heads(value_ptr, value_cache_ptr, v_scale_ptr, tokens, heads, write, head_mask, stride_value_token,
                stride_value_head, block_index * stride_value_cache_block + block_offset * stride_value_cache_entry,
                stride_value_cache_head, stride_v_scale, 0, value_head_width, FP8_FORMAT, BLOCK_VALUE_HEAD,
                FULL_VALUE_HEAD, ALIGNED)


@functools.lru_cache(config.LAUNCH_CACHE_SIZE)
def launch_config(num_slots: int, num_kv_heads: int, head_size: int, value_head_size: int,
                  fp8_format: str | None) -> tuple[tuple, int, dict]:
    """(grid, KV heads per program, constexprs and options) of a layout; memoized (``config``)."""
    kv_heads_per_program = config.heads_per_program(num_kv_heads, head_size + value_head_size)
    block_kv_heads = config.block(kv_heads_per_program)
    block_head, block_value_head = config.block(head_size), config.block(value_head_size)
    block_tokens = config.token_block(num_slots, block_kv_heads * (head_size + value_head_size))
    grid = (config.cdiv(num_slots, block_tokens), config.cdiv(num_kv_heads, kv_heads_per_program))
    return grid, kv_heads_per_program, config.Constexprs(
        FP8_FORMAT=FP8_FORMATS[fp8_format], BLOCK_TOKENS=block_tokens, BLOCK_KV_HEADS=block_kv_heads,
        BLOCK_HEAD=block_head, BLOCK_VALUE_HEAD=block_value_head, FULL_HEAD=head_size == block_head,
        FULL_VALUE_HEAD=value_head_size == block_value_head,
        num_warps=config.num_warps(block_tokens * block_kv_heads * (block_head + block_value_head)),
        **config.COMPILE_OPTIONS)


#: the kernel's launches, Triton's per-call binding done once per layout (launcher.py)
launcher = Launcher(flash_cache_kernel)
#: fp8 caches store code bits: the caches' positions among the kernel's arguments (``Plan.code_bits``)
FP8_CODE_BITS = launcher.positions("key_cache_ptr", "value_cache_ptr")


def launch(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           slot_mapping: torch.Tensor, fp8_format: str | None, k_scale: torch.Tensor, v_scale: torch.Tensor,
           slot: list | None = None) -> None:
    """Launch on already validated arguments; strides come from the tensors as given. ``slot``:
    ``mla_fuse.layouts``' slot for these arguments' layout, where their launch plan is kept
    (``config.planned``)."""
    plan = config.planned(slot, _plan, key, value, key_cache, value_cache, slot_mapping, fp8_format, k_scale,
                          v_scale)
    if plan:
        launcher(plan, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)


def _plan(key, value, key_cache, value_cache, slot_mapping, fp8_format, k_scale, v_scale) -> Plan | tuple:
    """The launch's ``Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``); () when there is nothing to launch."""
    num_slots = slot_mapping.size(0)
    num_kv_heads, head_size, value_head_size = key.size(1), key.size(2), value.size(2)
    if num_slots == 0 or num_kv_heads == 0:
        return ()
    grid, kv_heads_per_program, constexprs = launch_config(num_slots, num_kv_heads, head_size, value_head_size,
                                                           fp8_format)
    stride_key, stride_value, stride_key_cache, stride_value_cache = (
        key.stride(), value.stride(), key_cache.stride(), value_cache.stride())
    aligned = config.aligned(
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        key.element_size() * (stride_key[0] | stride_key[1] | stride_value[0] | stride_value[1]),
        key_cache.element_size() * (stride_key_cache[0] | stride_key_cache[1] | stride_key_cache[2]
                                    | stride_value_cache[0] | stride_value_cache[1] | stride_value_cache[2]))
    return Plan(grid, (
        num_slots, num_kv_heads, kv_heads_per_program, key_cache.size(1), head_size, value_head_size,
        stride_key[0], stride_key[1], stride_value[0], stride_value[1], slot_mapping.stride(0),
        *stride_key_cache[:3], *stride_value_cache[:3],
        config.scale_stride(k_scale), config.scale_stride(v_scale),
    ), constexprs, aligned, code_bits=() if fp8_format is None else FP8_CODE_BITS)
