"""Properties of the MLA operations: ``concat_and_cache_mla`` and its fused rope form (CONTRACT §2-§4)."""

from mla_fuse_conformance.running import harness
from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.running.harness import bad_input_prop, prop

EDGES = strategies.edge_cases("mla")

FUSED = "concat_and_cache_mla_rope_fused"
FOUND = [
    # triton, mid-development: -1007.6 / 1 stored as E4M3 0x88 instead of saturating to 0xfe (-448)
    MlaCase(seed=0, tokens=1, heads=1, latent=1, rotary_dim=4, dtype="float32", kv_cache_dtype="fp8",
            num_blocks=2, block_size=1, slots=SlotSpec(length=1), table=TableSpec("plain", 4, 1),
            cache_storage="uint8", kv_packed=False, values=ValueSpec(log2_magnitude=8.8)),
]


@prop("concat_and_cache_mla", cases=strategies.mla_cases(fused=False), examples=FOUND + EDGES)
def test_mla_cache_write_matches_reference(impl, device, case):
    """Entries ``[kv_c | k_pe]`` land at their slots (source bits, or fp8 codes per §5); padded,
    unused and out-of-batch slots and all memory around the views keep their sentinel bits."""
    return harness.against_reference(impl, device, case, "concat_and_cache_mla")


@prop(FUSED, cases=strategies.mla_cases(fused=True), examples=FOUND + EDGES)
def test_fused_mla_matches_reference(impl, device, case):
    """q_pe and k_pe rotated within the bound (padded rows as declared), written back into
    their parents; the cache holds the rotated k_pe written back (or its fp8 code)."""
    return harness.against_reference(impl, device, case, FUSED)


@prop(FUSED, "rotary_embedding", "concat_and_cache_mla", cases=strategies.mla_cases(fused=True),
      examples=EDGES)
def test_fused_mla_equals_unfused_chain(impl, device, case):
    """The fused op writes the same cache bits as rotary_embedding then concat_and_cache_mla."""
    harness.fused_equals_unfused(impl, device, case, FUSED)


@bad_input_prop("concat_and_cache_mla", examples_per_corruption=2)
def test_mla_cache_write_rejects_bad_input(impl, device, case):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    harness.rejects_bad_input(impl, device, case)


@bad_input_prop(FUSED, examples_per_corruption=2)
def test_fused_mla_rejects_bad_input(impl, device, case):
    """Bad input raises ValueError/TypeError naming the argument, before writing anything."""
    harness.rejects_bad_input(impl, device, case)
