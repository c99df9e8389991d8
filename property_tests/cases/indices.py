"""Strategies for what a case indexes with: the cos/sin table of a rope, the positions, the slot mapping."""

from __future__ import annotations

from hypothesis import strategies as st

from mla_fuse_conformance.cases.sizes import limits, weighted
from mla_fuse_conformance.cases.types import PositionSpec, SlotSpec, TableSpec
from mla_fuse_conformance.declarations.dtypes import INDEX_DTYPES

index_dtypes = st.sampled_from(INDEX_DTYPES)


@st.composite
def tables(draw, rotary_dim: int) -> TableSpec:
    """Plain or DeepSeek YaRN tables, fp32 or the input dtype; small, medium, or large and poisoned."""
    lim = limits()
    style = draw(st.sampled_from(("plain", "deepseek_yarn")))
    dtype = draw(st.sampled_from(("float32", "input")))
    size = draw(weighted(("small", 3), ("medium", 1), ("large", 1)))
    poison = draw(st.booleans())
    if style == "plain":
        rows = {"small": st.integers(1, 64), "medium": st.integers(65, lim.max_full_table_rows),
                "large": st.sampled_from(lim.large_table_rows)}[size]
        max_position = draw(rows)
        base = draw(st.sampled_from((10000.0, 500.0, 1e6)))
        return TableSpec("plain", rotary_dim, max_position, dtype, base,
                         poison_unused_rows=poison or max_position > lim.max_full_table_rows)
    original = draw(st.sampled_from(lim.yarn_original_positions))
    factor = draw(st.sampled_from((4.0, 40.0, 1.5, 2.0)))
    if size == "small":
        original, factor = min(original, 32), min(factor, 4.0)
    return TableSpec(
        "deepseek_yarn", rotary_dim, original, dtype, draw(st.sampled_from((10000.0, 500.0))), factor,
        yarn_mscale=draw(st.sampled_from((1.0, 0.707))), yarn_mscale_all_dim=draw(st.sampled_from((0.0, 1.0, 0.707))),
        yarn_attn_factor=draw(st.sampled_from((1.0, 0.5))),
        poison_unused_rows=poison or original * factor > lim.max_full_table_rows)


@st.composite
def position_specs(draw) -> PositionSpec:
    return PositionSpec(draw(index_dtypes), draw(st.sampled_from(("uniform", "prefill", "last_rows", "zeros"))),
                        draw(weighted((1, 4), (2, 1), (3, 1))))


@st.composite
def slot_specs(draw, tokens: int, full_length: bool = False) -> SlotSpec:
    """Any padding pattern; ``slot_mapping`` as long as T or shorter (graph padding)."""
    length = tokens if full_length or not draw(st.booleans()) else draw(st.integers(0, tokens))
    return SlotSpec(length, draw(st.sampled_from(("none", "some", "all"))), draw(st.sampled_from((0.5, 0.1, 0.9))),
                    draw(weighted((-1, 3), (-2, 1))), draw(st.sampled_from(("random", "prefill", "extremes"))),
                    draw(index_dtypes), draw(weighted((1, 4), (2, 1))))
