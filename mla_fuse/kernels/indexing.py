"""Index helpers shared by the kernels: program id -> tokens and heads, slot -> cache entry, head stores.

Every index used in an address is int64 (tokens * heads * dims can pass
2^31) and clamped in bounds where its mask is off, so masked-off lanes never
form out-of-bounds addresses.

Paged caches (CONTRACT §2): ``slot = slot_mapping[t]`` for ``t < len(slot_mapping)``
(never read past its end); ``slot < 0`` is padding and writes nothing;
otherwise the entry is at block ``slot // B``, offset ``slot % B``, with the
cache's real block size ``B`` and its block and entry strides.
"""

from __future__ import annotations

import triton.language as tl

from mla_fuse.kernels import jit
from mla_fuse.kernels.conversions import quantize


@jit
def token_range(num_tokens, BLOCK_TOKENS: tl.constexpr):
    """This program's tokens ``pid(0) * BLOCK_TOKENS + [0, BLOCK_TOKENS)``: (int64 index, mask)."""
    tokens = tl.program_id(0).to(tl.int64) * BLOCK_TOKENS + tl.arange(0, BLOCK_TOKENS)
    token_mask = tokens < num_tokens
    return tl.where(token_mask, tokens, 0), token_mask


@jit
def head_range(head_block, heads_per_program, num_heads, BLOCK_HEADS: tl.constexpr):
    """Heads ``[head_block * heads_per_program, +heads_per_program) ∩ [0, num_heads)``: (int64 index, mask)."""
    first_head = head_block.to(tl.int64) * heads_per_program
    heads = first_head + tl.arange(0, BLOCK_HEADS)
    head_mask = (heads < num_heads) & (heads < first_head + heads_per_program)
    return tl.where(head_mask, heads, 0), head_mask


@jit
def cache_slots(slot_mapping_ptr, tokens, token_mask, num_slots, stride_slot, block_size):
    """(block index, offset in the block, whether to write) of each token's cache entry.

    Written: ``t < len(slot_mapping)`` and ``slot >= 0``. The others point at
    entry 0 of block 0 and are masked off; ``slot_mapping`` is never read past its end.
    """
    has_slot = token_mask & (tokens < num_slots)
    slots = tl.load(slot_mapping_ptr + tokens * stride_slot, mask=has_slot, other=-1).to(tl.int64)
    write = slots >= 0
    slots = tl.where(write, slots, 0)
    return slots // block_size, slots % block_size, write


@jit
def entry_rows(src_ptr, cache_ptr, tokens, entries, write, stride_token, first_element, width,
               BLOCK: tl.constexpr, FULL: tl.constexpr, ALIGNED: tl.constexpr):
    """Pointers to ``src[tokens, 0:width]`` and to elements ``first_element + [0, width)`` of the tokens'
    cache entries, and their mask (entries written only): ``[BLOCK_TOKENS, BLOCK]`` each.

    ``FULL``: ``width`` is exactly ``BLOCK`` (no clamp). ``ALIGNED``: the launcher found every source
    row, cache entry and ``first_element`` on a 16-byte boundary; a full range is marked so.
    """
    element = tl.arange(0, BLOCK).to(tl.int64)[None, :]
    mask = write[:, None] & (element < width)
    if not FULL:  # clamp masked-off lanes in bounds
        element = tl.minimum(element, width - 1)
    src = src_ptr + tokens[:, None] * stride_token + element
    dst = cache_ptr + (entries + first_element)[:, None] + element
    if ALIGNED and FULL:
        src = tl.multiple_of(src, [1, 16])
        dst = tl.multiple_of(dst, [1, 16])
    return src, dst, mask


@jit
def store_heads(src_ptr, cache_ptr, scale_ptr, tokens, heads, write, head_mask, stride_token, stride_head,
                entry_offsets, stride_cache_head, stride_scale, first_element, end_element,
                FP8_FORMAT: tl.constexpr, BLOCK_ELEMENTS: tl.constexpr, FULL: tl.constexpr, ALIGNED: tl.constexpr):
    """Copy (or quantize) ``src[tokens, heads, first_element:end_element]`` into the cache entries.

    ``FULL``: the range is exactly ``BLOCK_ELEMENTS`` wide (no clamp; the caller passes the bounds as
    constexprs then, so the code is what constexpr sizes give). ``ALIGNED``: the launcher found every
    source row, cache entry and ``first_element`` on a 16-byte boundary; a full range is marked so.
    """
    element = first_element + tl.arange(0, BLOCK_ELEMENTS).to(tl.int64)[None, None, :]
    mask = (write[:, None] & head_mask[None, :])[:, :, None] & (element < end_element)
    if not FULL:  # clamp masked-off lanes in bounds
        element = tl.minimum(element, end_element - 1)
    src = src_ptr + (tokens[:, None] * stride_token + heads[None, :] * stride_head)[:, :, None] + element
    rows = cache_ptr + entry_offsets[:, None] + heads[None, :] * stride_cache_head
    dst = rows[:, :, None] + element
    if ALIGNED and FULL:
        src = tl.multiple_of(src, [1, 1, 16])
        dst = tl.multiple_of(dst, [1, 1, 16])
    values = tl.load(src, mask=mask)
    if FP8_FORMAT != 0:
        # code = fp8(clamp(x / scale[h]))
        scale = tl.load(scale_ptr + heads * stride_scale, mask=head_mask, other=1.0)
        values = quantize(values, scale[None, :, None], FP8_FORMAT)
    tl.store(dst, values, mask=mask)
