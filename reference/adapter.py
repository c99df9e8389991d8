"""The reference as an in-place implementation (registered as ``reference``).

It computes the functional result and copies it into the arguments, so
writes into views land in their parent storage. It promises nothing about
bad input (``checks_inputs = False``).
"""

from __future__ import annotations

from . import ops


class ReferenceImplementation:
    name = "reference"
    rounding = "single"
    padded_rows = "rotated"
    checks_inputs = False

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        new_query, new_key = ops.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        query.copy_(new_query)
        if key is not None:
            key.copy_(new_key)

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        kv_cache.copy_(ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale))

    def concat_and_cache_mla_rope_fused(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                        kv_cache, kv_cache_dtype, kv_cache_scale):
        new_q_pe, new_k_pe, new_cache = ops.concat_and_cache_mla_rope_fused(
            positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype,
            kv_cache_scale)
        q_pe.copy_(new_q_pe)
        k_pe.copy_(new_k_pe)
        kv_cache.copy_(new_cache)

    def reshape_and_cache_flash(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                v_scale):
        new_key_cache, new_value_cache = ops.reshape_and_cache_flash(
            key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
        key_cache.copy_(new_key_cache)
        value_cache.copy_(new_value_cache)

    def rope_and_reshape_and_cache_flash(self, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                         cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale):
        new_query, new_key, new_key_cache, new_value_cache = ops.rope_and_reshape_and_cache_flash(
            positions, query, key, value, key_cache, value_cache, slot_mapping, cos_sin_cache, is_neox,
            kv_cache_dtype, k_scale, v_scale)
        query.copy_(new_query)
        key.copy_(new_key)
        key_cache.copy_(new_key_cache)
        value_cache.copy_(new_value_cache)
