"""The paged-cache stage of the eager mutant implementation: entries written at their slots by
explicit address arithmetic on the cache's storage, like a kernel, with the padding, slot and
cache-layout bugs (switched on by ``self.bug``)."""

from __future__ import annotations

import math

import torch

from mla_fuse_conformance.mutants.eager_rope import UNPROCESSED_BLOCK

ENTRY_TILE = 256  # entry_tile_256_without_loop
LARGEST_DECODE = 16  # prefill_dense_block_stride: a launch of more tokens takes the prefill path
WIDE_ENTRY = 128  # prefill_dense_block_stride: ... for entries of at least this many elements


class CacheWriteStage:
    """MLA and flash cache writes, with the slot and layout bugs."""

    bug = "none"

    def _k_pe_as_read(self, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """k_pe as the ``k_pe_read_with_kv_c_row_stride`` mutant addresses it (reads it, and rotates it in
        place in the fused op): where kv_c is contiguous and k_pe is not, with kv_c's row stride
        (unchanged where that would run past k_pe's storage)."""
        if self.bug != "k_pe_read_with_kv_c_row_stride" or not kv_c.is_contiguous() or k_pe.is_contiguous():
            return k_pe
        stride = (kv_c.stride(0), k_pe.stride(1))
        last = k_pe.storage_offset() + (k_pe.size(0) - 1) * stride[0] + (k_pe.size(1) - 1) * stride[1]
        if last >= k_pe.untyped_storage().nbytes() // k_pe.element_size():
            return k_pe
        return torch.as_strided(k_pe, k_pe.shape, stride, k_pe.storage_offset())

    def _mla_write(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> None:
        k_pe = self._k_pe_as_read(kv_c, k_pe)
        if self.bug == "token_stride_ignored":
            kv_c = torch.as_strided(kv_c, kv_c.shape, (kv_c.size(1), 1), kv_c.storage_offset())
        latent = self._stored(kv_c, kv_cache_dtype, scale)
        rope = self._stored(k_pe, kv_cache_dtype, scale)
        parts = (rope, latent) if self.bug == "mla_regions_swapped" else (latent, rope)
        entries = torch.cat(parts, dim=-1)  # [T, L + R]
        self._write_entries(kv_cache, entries[:, None, :], slot_mapping)

    def _flash_write(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        if self.bug == "fp8_kv_scales_swapped":
            k_scale, v_scale = v_scale, k_scale
        if self.bug == "fp8_value_scale_ignored":
            v_scale = torch.ones_like(v_scale)
        key = self._stored(key, kv_cache_dtype, k_scale.reshape(1, -1, 1))
        value = self._stored(value, kv_cache_dtype, v_scale.reshape(1, -1, 1))
        self._write_entries(key_cache, key, slot_mapping)
        self._write_entries(value_cache, value, slot_mapping)

    def _slots(self, slot_mapping: torch.Tensor, tokens: int) -> torch.Tensor:
        if self.bug == "reads_slot_mapping_past_end" and slot_mapping.numel() < tokens:
            available = slot_mapping.untyped_storage().nbytes() // slot_mapping.element_size()
            stride = max(slot_mapping.stride(0), 1)
            count = min(tokens, (available - slot_mapping.storage_offset() - 1) // stride + 1)
            slot_mapping = torch.as_strided(slot_mapping, (count,), (stride,), slot_mapping.storage_offset())
        return slot_mapping.long()

    def _write_entries(self, cache: torch.Tensor, entries: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write ``entries [T, heads, width]`` at their slots by explicit address arithmetic on the
        cache's storage, honouring its block, entry, head and element strides."""
        tokens = entries.size(0)
        if self.bug == "entry_tile_256_without_loop":
            cache, entries = cache[..., :ENTRY_TILE], entries[..., :ENTRY_TILE]
        processed = self._processed_tokens(tokens).to(cache.device)
        slots = self._slots(slot_mapping, tokens).to(cache.device)
        if cache.element_size() == 1:
            cache, entries = cache.view(torch.uint8), entries.view(torch.uint8) if entries.dtype != torch.uint8 \
                else entries
        storage = torch.as_strided(cache, (cache.untyped_storage().nbytes() // cache.element_size(),), (1,), 0)
        token = torch.arange(slots.numel(), device=cache.device)
        valid = (slots >= 0) & processed[: slots.numel()]
        if self.bug == "padded_slot_written_to_last":
            valid = processed[: slots.numel()].clone()
        if self.bug == "padded_tokens_write_reserved_slot":
            padded = token[slots < 0]
            reserved = torch.zeros_like(padded)
            self._store(storage, cache, reserved, _nan_like(entries[padded]))
        if self.bug == "rest_of_block_zeroed":
            blocks = (slots[valid] // cache.size(1)).unique()
            for offset in range(cache.size(1)):
                zeros = torch.zeros_like(entries[: blocks.numel()])
                self._store(storage, cache, blocks * cache.size(1) + offset, zeros)
        self._store(storage, cache, slots[valid], entries[token[valid]])

    def _store(self, storage, cache, slots, entries) -> None:
        block_size = cache.size(1)
        strides = list(cache.stride())
        if self.bug == "cache_assumed_contiguous":
            strides = list(torch.empty(cache.shape, device="meta").stride())
        entry = math.prod(cache.shape[2:])
        if self.bug == "prefill_dense_block_stride" and slots.numel() > LARGEST_DECODE and entry >= WIDE_ENTRY:
            strides[0] = block_size * entry
        if self.bug == "block_size_hardcoded_16":
            block = (slots // UNPROCESSED_BLOCK) % cache.size(0)
            offset = (slots % UNPROCESSED_BLOCK) % block_size
        else:
            block, offset = slots // block_size, slots % block_size  # slot -1: block -1, offset B - 1
        base = cache.storage_offset() + block * strides[0] + offset * strides[1]
        inner = _inner_offsets(cache.shape[2:], strides[2:], cache.device)
        address = base[:, None] + inner[None, :]
        if self.bug == "address_wraps_at_2_16":
            address = address % 2 ** 16
        storage[address.reshape(-1)] = entries.reshape(-1).to(storage.dtype)



def _inner_offsets(shape, strides, device) -> torch.Tensor:
    """Storage offsets of every element of one cache entry (``[width]`` or ``[heads, width]``), flattened."""
    offsets = torch.zeros(1, dtype=torch.long, device=device)
    for size, stride in zip(shape, strides):
        offsets = (offsets[:, None] + torch.arange(size, device=device)[None, :] * stride).reshape(-1)
    return offsets


def _nan_like(entries: torch.Tensor) -> torch.Tensor:
    if entries.dtype == torch.uint8:
        return torch.full_like(entries, 0x7F)
    return torch.full_like(entries, float("nan"))

