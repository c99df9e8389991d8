"""The operations of CONTRACT §4 and the declarations an implementation may make.

A leaf module: the registry, the harness and the mutants all import it, and it imports nothing of ours.
"""

from __future__ import annotations

OPERATIONS = (
    "rotary_embedding",
    "concat_and_cache_mla",
    "concat_and_cache_mla_rope_fused",
    "reshape_and_cache_flash",
    "rope_and_reshape_and_cache_flash",
)
# Positional argument names of each operation, exactly as in CONTRACT §4.
OPERATION_ARGUMENTS = {
    "rotary_embedding": ("positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"),
    "concat_and_cache_mla": ("kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype", "scale"),
    "concat_and_cache_mla_rope_fused": ("positions", "q_pe", "k_pe", "kv_c", "cos_sin_cache", "is_neox",
                                        "slot_mapping", "kv_cache", "kv_cache_dtype", "kv_cache_scale"),
    "reshape_and_cache_flash": ("key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype",
                                "k_scale", "v_scale"),
    "rope_and_reshape_and_cache_flash": ("positions", "query", "key", "value", "key_cache", "value_cache",
                                         "slot_mapping", "cos_sin_cache", "is_neox", "kv_cache_dtype", "k_scale",
                                         "v_scale"),
}
ROUNDING_MODES = ("single", "per_op")
PADDED_ROW_MODES = ("rotated", "q_only", "skipped")
