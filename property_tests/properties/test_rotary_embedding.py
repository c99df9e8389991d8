"""Properties of ``rotary_embedding`` (CONTRACT §1, §4)."""

import pytest
from hypothesis import given, settings

from mla_fuse_conformance.cases import corruptions, strategies
from mla_fuse_conformance.cases.every_value import every_value
from mla_fuse_conformance.cases.types import BadInputCase, RopeCase, TableSpec
from mla_fuse_conformance.running.harness import bad_input_examples, examples

EDGES = strategies.edge_cases("rope")

FOUND = [
    # reference/ops.py reshaped [0, heads, D] with -1 (tests/test_suite_checks.py pins it)
    RopeCase(seed=0, tokens=0, heads=1, kv_heads=0, head_size=2, dtype="float32", is_neox=False,
             table=TableSpec("plain", 2, 1)),
    RopeCase(seed=0, tokens=0, heads=2, kv_heads=1, head_size=4, dtype="bfloat16", is_neox=True,
             table=TableSpec("plain", 2, 1), rank=2),
]


@pytest.mark.mla_fuse("rotary_embedding")
@examples(FOUND + EDGES + every_value(FOUND + EDGES, rotates=True))
@given(case=strategies.rope_cases())
def test_rotary_embedding_matches_reference(mla_fuse, case):
    """q and k rotated within the §5 bound; the unrotated tail, the parents around the views,
    positions and table unchanged bit for bit."""
    mla_fuse.against_reference(case, "rotary_embedding")


@pytest.mark.mla_fuse("rotary_embedding", bad_input=True, examples_per_corruption=2)
@pytest.mark.parametrize("corruption", corruptions.names("rotary_embedding"))
@settings(max_examples=bad_input_examples(2))
@given(base=strategies.BASE_CASES["rotary_embedding"]())
def test_rotary_embedding_rejects_bad_input(mla_fuse, corruption, base):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    mla_fuse.rejects_bad_input(BadInputCase("rotary_embedding", corruption, base))
