"""Properties of the MHA (flash layout) operations: ``reshape_and_cache_flash`` and its fused rope form."""

import pytest
from hypothesis import given, settings

from mla_fuse_conformance.cases import corruptions, strategies
from mla_fuse_conformance.cases.every_value import every_value
from mla_fuse_conformance.cases.types import BadInputCase, FlashCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.running.harness import bad_input_examples, examples

EDGES = strategies.edge_cases("flash")
FOUND = [
    # reference: a NaN in the unrotated tail of key came back as 0xffff, not its input bits 0x7fc0
    # (round_once on the tail; tests/test_suite_checks.py pins it)
    FlashCase(seed=0, tokens=2, heads=1, kv_heads=1, head_size=8, value_head_size=1, dtype="bfloat16",
              kv_cache_dtype="auto", num_blocks=3, block_size=1, slots=SlotSpec(length=2),
              table=TableSpec("plain", 2, 1), is_neox=False, values=ValueSpec(nan_count=1)),
]

CACHE_WRITE = "reshape_and_cache_flash"
FUSED = "rope_and_reshape_and_cache_flash"


@pytest.mark.mla_fuse(CACHE_WRITE)
@examples(EDGES + every_value(EDGES, rotates=False))
@given(case=strategies.flash_cases(fused=False))
def test_flash_cache_write_matches_reference(mla_fuse, case):
    """key and value rows land at their slots in caches of any stride order (source bits, or
    fp8 codes with per-head K and V scales); every other byte keeps its sentinel."""
    mla_fuse.against_reference(case, CACHE_WRITE)


@pytest.mark.mla_fuse(FUSED)
@examples(FOUND + EDGES + every_value(FOUND + EDGES, rotates=True))
@given(case=strategies.flash_cases(fused=True))
def test_fused_flash_matches_reference(mla_fuse, case):
    """query and key rotated within the bound (partial rotary: the tail bit for bit); the key
    cache holds the rotated key written back (or its fp8 code); value stored as in the unfused op."""
    mla_fuse.against_reference(case, FUSED)


@pytest.mark.mla_fuse(FUSED, "rotary_embedding", CACHE_WRITE)
@examples(EDGES + every_value(EDGES, rotates=True))
@given(case=strategies.flash_cases(fused=True))
def test_fused_flash_equals_unfused_chain(mla_fuse, case):
    """The fused op writes the same cache bits as rotary_embedding then reshape_and_cache_flash."""
    mla_fuse.fused_equals_unfused(case, FUSED)


@pytest.mark.mla_fuse(CACHE_WRITE, bad_input=True, examples_per_corruption=2)
@pytest.mark.parametrize("corruption", corruptions.names(CACHE_WRITE))
@settings(max_examples=bad_input_examples(2))
@given(base=strategies.BASE_CASES[CACHE_WRITE]())
def test_flash_cache_write_rejects_bad_input(mla_fuse, corruption, base):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    mla_fuse.rejects_bad_input(BadInputCase(CACHE_WRITE, corruption, base))


@pytest.mark.mla_fuse(FUSED, bad_input=True, examples_per_corruption=2)
@pytest.mark.parametrize("corruption", corruptions.names(FUSED))
@settings(max_examples=bad_input_examples(2))
@given(base=strategies.BASE_CASES[FUSED]())
def test_fused_flash_rejects_bad_input(mla_fuse, corruption, base):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    mla_fuse.rejects_bad_input(BadInputCase(FUSED, corruption, base))
