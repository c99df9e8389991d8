"""Properties of the MHA (flash layout) operations: ``reshape_and_cache_flash`` and its fused rope form."""

from mla_fuse_conformance.running import harness
from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.cases.types import FlashCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.running.harness import bad_input_prop, prop

EDGES = strategies.edge_cases("flash")
FOUND = [
    # reference: a NaN in the unrotated tail of key came back as 0xffff, not its input bits 0x7fc0
    # (round_once on the tail; test_suite_checks pins it)
    FlashCase(seed=0, tokens=2, heads=1, kv_heads=1, head_size=8, value_head_size=1, dtype="bfloat16",
              kv_cache_dtype="auto", num_blocks=3, block_size=1, slots=SlotSpec(length=2),
              table=TableSpec("plain", 2, 1), is_neox=False, values=ValueSpec(nan_count=1)),
]

FUSED = "rope_and_reshape_and_cache_flash"


@prop("reshape_and_cache_flash", cases=strategies.flash_cases(fused=False), examples=EDGES)
def test_flash_cache_write_matches_reference(impl, device, case):
    """key and value rows land at their slots in caches of any stride order (source bits, or
    fp8 codes with per-head K and V scales); every other byte keeps its sentinel."""
    return harness.against_reference(impl, device, case, "reshape_and_cache_flash")


@prop(FUSED, cases=strategies.flash_cases(fused=True), examples=FOUND + EDGES)
def test_fused_flash_matches_reference(impl, device, case):
    """query and key rotated within the bound (partial rotary: the tail bit for bit); the key
    cache holds the rotated key written back (or its fp8 code); value stored as in the unfused op."""
    return harness.against_reference(impl, device, case, FUSED)


@prop(FUSED, "rotary_embedding", "reshape_and_cache_flash", cases=strategies.flash_cases(fused=True),
      examples=EDGES)
def test_fused_flash_equals_unfused_chain(impl, device, case):
    """The fused op writes the same cache bits as rotary_embedding then reshape_and_cache_flash."""
    harness.fused_equals_unfused(impl, device, case, FUSED)


@bad_input_prop("reshape_and_cache_flash", examples_per_corruption=2)
def test_flash_cache_write_rejects_bad_input(impl, device, case):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    harness.rejects_bad_input(impl, device, case)


@bad_input_prop(FUSED, examples_per_corruption=2)
def test_fused_flash_rejects_bad_input(impl, device, case):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    harness.rejects_bad_input(impl, device, case)
