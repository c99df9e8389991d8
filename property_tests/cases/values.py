"""Strategies for the values a case holds: input dtypes, magnitudes (relative to an fp8 cache's
scale: underflow, ordinary codes, saturation, rounding midpoints), scales, cache formats."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from mla_fuse_conformance.cases.sizes import weighted
from mla_fuse_conformance.cases.types import ScaleSpec, ValueSpec
from mla_fuse_conformance.declarations.dtypes import (FP8_CACHE_DTYPES, FP8_FORMAT_OF_KV_CACHE_DTYPE,
                                                       FP8_FORMATS, FP8_STORAGES)

# log2 of each fp8 cache dtype's finite max (8.8, 15.8), to aim values below, at and past saturation
FP8_LOG2_MAX = {name: round(math.log2(FP8_FORMATS[fmt]), 1) for name, fmt in FP8_FORMAT_OF_KV_CACHE_DTYPE.items()}
# bf16 the most frequent, as engines run it (float32 first: a failure shrinks towards it where it can)
dtypes = weighted(("float32", 2), ("bfloat16", 5), ("float16", 1))


@st.composite
def value_specs(draw, kv_cache_dtype: str = "auto", scale: ScaleSpec | None = None) -> ValueSpec:
    """Magnitudes from tiny to large; for fp8 caches, relative to the scale: underflow to zero,
    ordinary codes, and past the finite max (saturation), with values on rounding midpoints."""
    spread = draw(st.sampled_from((2.0, 0.0, 6.0)))
    nan_count = draw(weighted((0, 5), (1, 1), (3, 1)))
    if kv_cache_dtype not in FP8_CACHE_DTYPES:
        return ValueSpec(float(draw(st.integers(-12, 12))), spread, nan_count)
    scale_log2 = 0.0 if scale is None else scale.log2
    above_max = draw(st.integers(-14, 6))  # log2(|x| / scale) - log2(fp8 max)
    magnitude = scale_log2 + FP8_LOG2_MAX[kv_cache_dtype] + above_max
    midpoints = draw(st.sampled_from((0.0, 0.5, 1.0, 0.1)))
    return ValueSpec(float(magnitude), spread, nan_count, midpoints)


@st.composite
def scale_specs(draw, per_head_allowed: bool = False) -> ScaleSpec:
    """Unit, tiny, large, non-power-of-two, per-head."""
    log2 = draw(weighted((0, 2), (None, 3)))
    if log2 is None:
        log2 = draw(st.integers(-20, 12))
    mantissa = draw(st.sampled_from((1.0, 1.37109375, 1.9, 1.1, 1.0009765625)))
    per_head = per_head_allowed and draw(st.booleans())
    return ScaleSpec(float(log2), mantissa, per_head)


@st.composite
def cache_formats(draw, dtype: str) -> tuple[str, str]:
    """``(kv_cache_dtype, cache_storage)``: ``auto`` or the named dtype (source bits), or fp8 in
    uint8 or float8 storage."""
    kv_cache_dtype = draw(st.sampled_from(("auto", dtype, *FP8_CACHE_DTYPES)))
    storage = "source" if kv_cache_dtype not in FP8_CACHE_DTYPES else draw(st.sampled_from(FP8_STORAGES))
    return kv_cache_dtype, storage
