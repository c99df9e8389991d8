"""Properties of ``rotary_embedding`` (CONTRACT §1, §4)."""

from mla_fuse_conformance.running import harness
from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.cases.types import RopeCase, TableSpec
from mla_fuse_conformance.running.harness import bad_input_prop, prop

EDGES = strategies.edge_cases("rope")

FOUND = [
    # reference/ops.py reshaped [0, heads, D] with -1 (test_suite_checks pins it)
    RopeCase(seed=0, tokens=0, heads=1, kv_heads=0, head_size=2, dtype="float32", is_neox=False,
             table=TableSpec("plain", 2, 1)),
    RopeCase(seed=0, tokens=0, heads=2, kv_heads=1, head_size=4, dtype="bfloat16", is_neox=True,
             table=TableSpec("plain", 2, 1), rank=2),
]


@prop("rotary_embedding", cases=strategies.rope_cases(), examples=FOUND + EDGES)
def test_rotary_embedding_matches_reference(impl, device, case):
    """q and k rotated within the §5 bound; the unrotated tail, the parents around the views,
    positions and table unchanged bit for bit."""
    return harness.against_reference(impl, device, case, "rotary_embedding")


@bad_input_prop("rotary_embedding", examples_per_corruption=2)
def test_rotary_embedding_rejects_bad_input(impl, device, case):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    harness.rejects_bad_input(impl, device, case)
