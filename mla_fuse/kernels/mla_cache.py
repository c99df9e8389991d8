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
"""

from __future__ import annotations

import torch
import triton.language as tl

from mla_fuse.kernels import config, jit
from mla_fuse.kernels.conversions import FP8_FORMATS, quantize
from mla_fuse.kernels.indexing import cache_slots, token_range


@jit
def mla_cache_kernel(
    # pointers
    kv_c_ptr, k_pe_ptr, slot_mapping_ptr, kv_cache_ptr, scale_ptr,
    # sizes
    num_slots, block_size,
    # strides
    stride_kv_c_token, stride_k_token, stride_slot, stride_cache_block, stride_cache_entry,
    # constexprs
    LATENT: tl.constexpr, ROTARY: tl.constexpr, FP8_FORMAT: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr, BLOCK_LATENT: tl.constexpr, BLOCK_ROTARY: tl.constexpr,
):
    # ---- program id -> tokens
    tokens, token_mask = token_range(num_slots, BLOCK_TOKENS)

    # ---- load slot -> cache entry (slot >= 0 only)
    block_index, block_offset, write = cache_slots(slot_mapping_ptr, tokens, token_mask, num_slots, stride_slot,
                                                   block_size)
    entries = block_index * stride_cache_block + block_offset * stride_cache_entry  # int64 [BLOCK_TOKENS]

    # ---- load kv_c [BLOCK_TOKENS, BLOCK_LATENT] and k_pe [BLOCK_TOKENS, BLOCK_ROTARY]
    latent = tl.arange(0, BLOCK_LATENT).to(tl.int64)[None, :]
    latent_mask = write[:, None] & (latent < LATENT)
    if BLOCK_LATENT != LATENT:  # clamp masked-off lanes in bounds
        latent = tl.minimum(latent, LATENT - 1)
    kv_c = tl.load(kv_c_ptr + tokens[:, None] * stride_kv_c_token + latent, mask=latent_mask)
    rotary = tl.arange(0, BLOCK_ROTARY).to(tl.int64)[None, :]
    rotary_mask = write[:, None] & (rotary < ROTARY)
    if BLOCK_ROTARY != ROTARY:
        rotary = tl.minimum(rotary, ROTARY - 1)
    k_pe = tl.load(k_pe_ptr + tokens[:, None] * stride_k_token + rotary, mask=rotary_mask)

    # ---- quantize (fp8 caches): code = fp8(clamp(x / scale))
    if FP8_FORMAT != 0:
        scale = tl.load(scale_ptr)
        kv_c = quantize(kv_c, scale, FP8_FORMAT)
        k_pe = quantize(k_pe, scale, FP8_FORMAT)

    # ---- store the entry [kv_c (L) | k_pe (R)]
    tl.store(kv_cache_ptr + entries[:, None] + latent, kv_c, mask=latent_mask)
    tl.store(kv_cache_ptr + (entries + LATENT)[:, None] + rotary, k_pe, mask=rotary_mask)


def launch(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
           fp8_format: str | None, scale: torch.Tensor) -> None:
    """Launch on already validated arguments; strides come from the tensors as given."""
    num_slots = slot_mapping.size(0)
    latent_dim, rotary_dim = kv_c.size(1), k_pe.size(1)
    if num_slots == 0:
        return
    if fp8_format is not None:
        kv_cache = kv_cache.view(torch.uint8)  # same storage and strides; stores the code bits
    block_tokens = config.token_block(num_slots, latent_dim + rotary_dim)
    grid = (config.cdiv(num_slots, block_tokens),)
    mla_cache_kernel[grid](
        kv_c, k_pe, slot_mapping, kv_cache, scale,
        num_slots, kv_cache.size(1),
        kv_c.stride(0), k_pe.stride(0), slot_mapping.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        LATENT=latent_dim, ROTARY=rotary_dim, FP8_FORMAT=FP8_FORMATS[fp8_format],
        BLOCK_TOKENS=block_tokens, BLOCK_LATENT=config.block(latent_dim), BLOCK_ROTARY=config.block(rotary_dim),
        num_warps=config.num_warps(block_tokens * (latent_dim + rotary_dim)), **config.COMPILE_OPTIONS,
    )
