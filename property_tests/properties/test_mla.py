"""Properties of the MLA operations: ``concat_and_cache_mla`` and its fused rope form (CONTRACT §2-§4)."""

import pytest
from hypothesis import given, settings

from mla_fuse_conformance.cases import corruptions, strategies
from mla_fuse_conformance.cases.every_value import every_value
from mla_fuse_conformance.cases.types import BadInputCase, MlaCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.running.harness import bad_input_examples, examples

EDGES = strategies.edge_cases("mla")

CACHE_WRITE = "concat_and_cache_mla"
FUSED = "concat_and_cache_mla_rope_fused"
FOUND = [
    # triton, mid-development: -1007.6 / 1 stored as E4M3 0x88 instead of saturating to 0xfe (-448)
    MlaCase(seed=0, tokens=1, heads=1, latent=1, rotary_dim=4, dtype="float32", kv_cache_dtype="fp8",
            num_blocks=2, block_size=1, slots=SlotSpec(length=1), table=TableSpec("plain", 4, 1),
            cache_storage="uint8", kv_packed=False, values=ValueSpec(log2_magnitude=8.8)),
]


@pytest.mark.mla_fuse(CACHE_WRITE)
@examples(FOUND + EDGES + every_value(FOUND + EDGES, rotates=False))
@given(case=strategies.mla_cases(fused=False))
def test_mla_cache_write_matches_reference(mla_fuse, case):
    """Entries ``[kv_c | k_pe]`` land at their slots (source bits, or fp8 codes per §5); padded,
    unused and out-of-batch slots and all memory around the views keep their sentinel bits."""
    mla_fuse.against_reference(case, CACHE_WRITE)


@pytest.mark.mla_fuse(FUSED)
@examples(FOUND + EDGES + every_value(FOUND + EDGES, rotates=True))
@given(case=strategies.mla_cases(fused=True))
def test_fused_mla_matches_reference(mla_fuse, case):
    """q_pe and k_pe rotated within the bound (padded rows as declared), written back into
    their parents; the cache holds the rotated k_pe written back (or its fp8 code)."""
    mla_fuse.against_reference(case, FUSED)


@pytest.mark.mla_fuse(FUSED, "rotary_embedding", CACHE_WRITE)
@examples(EDGES + every_value(EDGES, rotates=True))
@given(case=strategies.mla_cases(fused=True))
def test_fused_mla_equals_unfused_chain(mla_fuse, case):
    """The fused op writes the same cache bits as rotary_embedding then concat_and_cache_mla."""
    mla_fuse.fused_equals_unfused(case, FUSED)


@pytest.mark.mla_fuse(CACHE_WRITE, bad_input=True, examples_per_corruption=2)
@pytest.mark.parametrize("corruption", corruptions.names(CACHE_WRITE))
@settings(max_examples=bad_input_examples(2))
@given(base=strategies.BASE_CASES[CACHE_WRITE]())
def test_mla_cache_write_rejects_bad_input(mla_fuse, corruption, base):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    mla_fuse.rejects_bad_input(BadInputCase(CACHE_WRITE, corruption, base))


@pytest.mark.mla_fuse(FUSED, bad_input=True, examples_per_corruption=2)
@pytest.mark.parametrize("corruption", corruptions.names(FUSED))
@settings(max_examples=bad_input_examples(2))
@given(base=strategies.BASE_CASES[FUSED]())
def test_fused_mla_rejects_bad_input(mla_fuse, corruption, base):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    mla_fuse.rejects_bad_input(BadInputCase(FUSED, corruption, base))
