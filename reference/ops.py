"""The five operations of CONTRACT §4, functional.

Same arguments as the in-place operations; each returns the new values of
what the in-place operation mutates, computed in float64 and rounded once.
"""

from __future__ import annotations

import torch

from .cache import flash_cache_write, mla_cache_write
from .rope import rope


def _as_heads(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``[T, heads, hs]`` view of a ``[T, heads, hs]`` or ``[T, heads * hs]`` tensor (T may be 0)."""
    return x if x.dim() == 3 else x.reshape(x.size(0), x.size(1) // head_size, head_size)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """-> (query, key) rotated; key may be None."""
    new_query = rope(positions, _as_heads(query, head_size), cos_sin_cache, is_neox).reshape(query.shape)
    if key is None:
        return new_query, None
    new_key = rope(positions, _as_heads(key, head_size), cos_sin_cache, is_neox).reshape(key.shape)
    return new_query, new_key


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """-> kv_cache with ``[kv_c | k_pe]`` entries written."""
    return mla_cache_write(kv_cache, kv_c, k_pe, slot_mapping, kv_cache_dtype, scale)


def concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                    kv_cache, kv_cache_dtype, kv_cache_scale):
    """-> (q_pe, k_pe, kv_cache): rope of q_pe and k_pe, then the MLA cache write of the rotated k_pe."""
    new_q_pe = rope(positions, q_pe, cos_sin_cache, is_neox)
    new_k_pe = rope(positions, k_pe[:, None, :], cos_sin_cache, is_neox)[:, 0, :]
    new_cache = mla_cache_write(kv_cache, kv_c, new_k_pe, slot_mapping, kv_cache_dtype, kv_cache_scale)
    return new_q_pe, new_k_pe, new_cache


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """-> (key_cache, value_cache) with the rows written."""
    return flash_cache_write(key_cache, value_cache, key, value, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                     cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale):
    """-> (query, key, key_cache, value_cache): rope of query and key, then the flash write of the rotated key."""
    new_query = rope(positions, query, cos_sin_cache, is_neox)
    new_key = rope(positions, key, cos_sin_cache, is_neox)
    new_key_cache, new_value_cache = flash_cache_write(key_cache, value_cache, new_key, value, slot_mapping,
                                                       kv_cache_dtype, k_scale, v_scale)
    return new_query, new_key, new_key_cache, new_value_cache
