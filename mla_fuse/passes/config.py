"""Fusion configuration: optimization levels and per-fusion flags.

============  ===========================================================
level         passes
============  ===========================================================
O0            none (the graph is compiled as traced)
O1            utility passes only (split coalescing, scatter/split replacement)
O2, O3        O1 + RoPE/KV-cache fusion (MHA and MLA) + defunctionalization
============  ===========================================================

A fusion flag left ``None`` takes its level's default; set explicitly it wins,
except that a fusion is always off when its cache-update op is a graph split
point (``splitting_ops``: the rope and the update then live in different
graphs). Only caches whose ``kv_cache_dtype`` is in ``fusable_kv_cache_dtypes``
are fused; others keep the unfused ops (counted as no match).
"""

from __future__ import annotations

import dataclasses
import enum


class OptimizationLevel(enum.IntEnum):
    O0 = 0
    O1 = 1
    O2 = 2
    O3 = 3


UNIFIED_MLA_UPDATE_NAME = "mla_fuse::unified_mla_kv_cache_update"
UNIFIED_UPDATE_NAME = "mla_fuse::unified_kv_cache_update"

ALL_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """What the pass manager runs. ``resolved()`` applies the level defaults and split points."""

    level: OptimizationLevel = OptimizationLevel.O2
    fuse_rope_kvcache: bool | None = None       # MHA: rotary_embedding + unified_kv_cache_update
    fuse_mla_rope_kvcache: bool | None = None   # MLA: rope of (q_pe, k_pe) + unified_mla_kv_cache_update
    splitting_ops: tuple[str, ...] = ()
    fusable_kv_cache_dtypes: tuple[str, ...] = ALL_KV_CACHE_DTYPES

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", OptimizationLevel(self.level))
        object.__setattr__(self, "splitting_ops", tuple(self.splitting_ops))
        object.__setattr__(self, "fusable_kv_cache_dtypes", tuple(self.fusable_kv_cache_dtypes))
        unknown = set(self.fusable_kv_cache_dtypes) - set(ALL_KV_CACHE_DTYPES)
        if unknown:
            raise ValueError(f"FusionConfig: unknown kv_cache_dtype(s) {sorted(unknown)}; known: {ALL_KV_CACHE_DTYPES}")

    @property
    def utility_passes(self) -> bool:
        return self.level >= OptimizationLevel.O1

    @property
    def rope_kvcache_enabled(self) -> bool:
        return self._fusion_enabled(self.fuse_rope_kvcache, UNIFIED_UPDATE_NAME)

    @property
    def mla_rope_kvcache_enabled(self) -> bool:
        return self._fusion_enabled(self.fuse_mla_rope_kvcache, UNIFIED_MLA_UPDATE_NAME)

    def _fusion_enabled(self, flag: bool | None, update_op: str) -> bool:
        if self.level == OptimizationLevel.O0 or _is_split_point(update_op, self.splitting_ops):
            return False
        return self.level >= OptimizationLevel.O2 if flag is None else flag


def _is_split_point(op_name: str, splitting_ops: tuple[str, ...]) -> bool:
    """``op_name`` or its ``.default`` overload named in ``splitting_ops`` (``::`` or ``.`` namespace)."""
    names = {op_name, op_name + ".default", op_name.replace("::", "."), op_name.replace("::", ".") + ".default"}
    return any(op in names for op in splitting_ops)
