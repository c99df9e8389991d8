"""The operations of CONTRACT §4 and the declarations an implementation may make about them.

A leaf module: the registry, the harness, the strategies and the mutants import it; it imports nothing.
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
# The operations that rotate (take positions and a cos/sin table), in OPERATIONS order.
ROTATING_OPERATIONS = tuple(op for op in OPERATIONS if "cos_sin_cache" in OPERATION_ARGUMENTS[op])
# The operations that write a paged cache (take a slot_mapping), in OPERATIONS order.
CACHING_OPERATIONS = tuple(op for op in OPERATIONS if "slot_mapping" in OPERATION_ARGUMENTS[op])

ROUNDING_MODES = ("single", "per_op")
PADDED_ROW_MODES = ("rotated", "q_only", "skipped")
# The operations that rotate and write a cache in one call.
FUSED_OPERATIONS = tuple(op for op in ROTATING_OPERATIONS if op in CACHING_OPERATIONS)
# Which case type an operation's cases are (cases.types RopeCase, MlaCase, FlashCase).
FAMILY_OF_OPERATION = {op: "rope" if op not in CACHING_OPERATIONS else "mla" if "kv_cache" in OPERATION_ARGUMENTS[op]
                       else "flash" for op in OPERATIONS}
