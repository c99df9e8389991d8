"""Paged-cache writes, functional: CONTRACT §2 and §3.

Slot ``s = slot_mapping[t]``; ``s < 0`` is padding and writes nothing; rows
``t >= len(slot_mapping)`` write nothing. Otherwise the entry goes to block
``s // B``, offset ``s % B``. Each function returns a new cache and leaves its
arguments alone.
"""

from __future__ import annotations

import torch

from . import fp8

FP8_FORMAT_OF_KV_CACHE_DTYPE = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}


def stored_bits(values: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor) -> torch.Tensor:
    """What the cache stores for ``values``, as raw bits (uint8 codes for fp8, else the values)."""
    fmt = FP8_FORMAT_OF_KV_CACHE_DTYPE.get(kv_cache_dtype)
    if fmt is None:
        return values  # auto / named float dtypes: the source bits, unchanged
    return fp8.quantize(values, scale, fmt)


def _as_bits(cache: torch.Tensor) -> torch.Tensor:
    """float8 caches are handled as their uint8 codes (same bytes)."""
    return cache.view(torch.uint8) if cache.element_size() == 1 else cache


def _scatter_entries(cache: torch.Tensor, entries: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Copy of ``cache`` with ``entries[t]`` written at slot ``slot_mapping[t]`` for every valid slot."""
    new_cache = cache.clone()
    bits = _as_bits(new_cache)
    block_size = cache.size(1)
    slots = slot_mapping.long()
    valid = slots >= 0  # padding writes nothing; never index with a negative slot
    tokens = torch.arange(slots.numel(), device=slots.device)[valid]  # rows past len(slot_mapping): none
    valid_slots = slots[valid]
    bits[valid_slots // block_size, valid_slots % block_size] = entries[tokens].to(bits.dtype)
    return new_cache


def mla_cache_write(kv_cache: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, slot_mapping: torch.Tensor,
                    kv_cache_dtype: str, scale: torch.Tensor) -> torch.Tensor:
    """MLA cache ``[NB, B, L + R]`` with entries ``[kv_c (L) | k_pe (R)]`` written."""
    entries = torch.cat([stored_bits(kv_c, kv_cache_dtype, scale), stored_bits(k_pe, kv_cache_dtype, scale)], -1)
    return _scatter_entries(kv_cache, entries, slot_mapping)


def _per_head(scale: torch.Tensor) -> torch.Tensor:
    """A ``[1]`` or ``[Hkv]`` scale shaped to broadcast over ``[T, Hkv, D]``."""
    return scale.reshape(1, -1, 1)


def flash_cache_write(key_cache: torch.Tensor, value_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor,
                      v_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash caches ``[NB, B, Hkv, D]`` / ``[NB, B, Hkv, Dv]`` with ``key``/``value`` rows written."""
    key_entries = stored_bits(key, kv_cache_dtype, _per_head(k_scale))
    value_entries = stored_bits(value, kv_cache_dtype, _per_head(v_scale))
    return (_scatter_entries(key_cache, key_entries, slot_mapping),
            _scatter_entries(value_cache, value_entries, slot_mapping))
