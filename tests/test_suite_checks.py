"""Checks of the suite itself (BUGS.md, "The suite itself"): the strategies reach every case of
CONTRACT §1-§4, the cheap table builder agrees with the reference's, the comparisons reject
planted errors, saved failures replay, and found bugs stay pinned."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from mla_fuse_conformance.declarations.property_modules import EXPLICIT_ONLY_MODULES
import mla_fuse_conformance.properties.test_flash  # noqa: F401  (register the properties checked below)
import mla_fuse_conformance.properties.test_mla  # noqa: F401
import mla_fuse_conformance.properties.test_rotary_embedding  # noqa: F401
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.cases import tensors as build
from mla_fuse_conformance.cases import types as cases
from mla_fuse_conformance.judging import comparisons
from mla_fuse_conformance.running import checks, harness
from mla_fuse_conformance.cases import memory
from mla_fuse_conformance.judging import oracle
from mla_fuse_conformance.running import recording
from mla_fuse_conformance.running import replay as repro
from mla_fuse_conformance.cases import strategies, values
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase, TableSpec
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import ops as ref_ops

STRATEGY_EXAMPLES = 300  # the strategies draw engine layouts, independent placements and offsets beside the sizes


def features(case) -> set[str]:
    """Everything CONTRACT §1-§4 asks the strategies to reach, as seen in one case."""
    found = {f"dtype {case.dtype}", f"table {case.table.style} {case.table.dtype}",
             f"positions {case.positions.dtype}", f"positions {case.positions.pattern}",
             "neox" if case.is_neox else "gptj"}
    found |= {"T=0"} if case.tokens == 0 else {"T=1"} if case.tokens == 1 else set()
    if case.tokens > 16 and case.tokens % 16:
        found.add("T past a 16-token block, with a tail")
    if case.table.num_positions > 2 ** 15:
        found.add("large positions (P > 2^15)")
    if case.positions.stride > 1:
        found.add("strided positions")
    if isinstance(case, RopeCase):
        found |= {f"query rank {case.rank}", "no key" if not case.kv_heads else "key"}
        found |= {"H=1"} if case.heads == 1 else {"H not a power of two"} if case.heads & (case.heads - 1) else set()
        if case.table.rotary_dim < case.head_size:
            found.add("partial rotary")
        if case.qkv_packed or not case.query_place.is_plain():
            found.add("strided q/k")
        return found
    slots = case.slots
    found |= {f"padding {slots.padding}", f"slots {slots.dtype}", f"kv_cache_dtype {case.kv_cache_dtype}",
              f"storage {case.cache_storage}"}
    if slots.length < case.tokens:
        found.add("slot_mapping shorter than T")
    if not case.cache_place.is_plain():
        found.add("cache view into a pool")
        if case.cache_place.pad[0] > 1000 or case.cache_place.pad[0] * case.block_size > 2 ** 12:
            found.add("cache view at the far end of a large pool")
    fp8 = case.kv_cache_dtype.startswith("fp8")
    scales = [case.scale] if isinstance(case, MlaCase) else [case.k_scale, case.v_scale]
    spec = case.values
    if fp8:
        if spec.midpoint_fraction:
            found.add("fp8 midpoints")
        if spec.log2_magnitude - scales[0].log2 > values.FP8_LOG2_MAX[case.kv_cache_dtype]:
            found.add("fp8 saturation")
        if spec.log2_magnitude - scales[0].log2 < values.FP8_LOG2_MAX[case.kv_cache_dtype] - 12:
            found.add("fp8 underflow")
    if spec.nan_count:
        found.add("NaN inputs")
    for scale in scales:
        found |= {"tiny scale"} if scale.log2 <= -10 else {"large scale"} if scale.log2 >= 8 else set()
        if scale.mantissa != 1.0:
            found.add("non-power-of-two scale")
    if isinstance(case, MlaCase):
        if case.kv_packed:
            found.add("kv_c and k_pe slices of one tensor")
        if case.q_place.offset and case.q_place.offset[2] > 0:
            found.add("q_pe a slice after nope")
        return found
    if any(s.per_head for s in scales):
        found.add("per-head scale")
    if case.k_scale != case.v_scale:
        found.add("k_scale != v_scale")
    if case.table.rotary_dim < case.head_size:
        found.add("partial rotary")
    if case.heads > case.kv_heads:
        found.add("GQA (H > Hkv)")
    found.add({(0, 1, 2): "cache NHD", (0, 2, 1): "cache HND"}.get(tuple(case.cache_order), "cache other order"))
    if case.kv_form != "split":
        found.add("K and V caches in one pool")
    if case.qkv_packed:
        found.add("q/k/v slices of one qkv")
    return found


COMMON = {f"dtype {d}" for d in FLOAT_DTYPES} | {
    "table plain float32", "table plain input", "table deepseek_yarn float32", "table deepseek_yarn input",
    "positions int32", "positions int64", "positions last_rows", "positions prefill", "neox", "gptj",
    "T past a 16-token block, with a tail", "large positions (P > 2^15)", "strided positions"}  # T=0, 1: EDGES
CACHE = {"padding none", "padding some", "padding all", "slots int32", "slots int64", "slot_mapping shorter than T",
         "storage uint8", "storage float8", "cache view into a pool", "cache view at the far end of a large pool",
         "fp8 midpoints", "fp8 saturation", "fp8 underflow", "NaN inputs", "tiny scale", "large scale",
         "non-power-of-two scale"} | {f"kv_cache_dtype {d}" for d in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")}
REQUIRED = {
    "rope": COMMON | {"query rank 2", "query rank 3", "no key", "key", "H=1", "H not a power of two",
                      "partial rotary", "strided q/k"},
    "mla": COMMON | CACHE | {"kv_c and k_pe slices of one tensor", "q_pe a slice after nope"},
    "flash": COMMON | CACHE | {"per-head scale", "k_scale != v_scale", "partial rotary", "GQA (H > Hkv)",
                               "cache NHD", "cache HND", "K and V caches in one pool", "q/k/v slices of one qkv"},
}
STRATEGIES = {"rope": strategies.rope_cases(), "mla": strategies.mla_cases(), "flash": strategies.flash_cases()}


@pytest.mark.parametrize("kind", sorted(REQUIRED))
def test_strategies_reach_every_contract_case(kind):
    seen: set[str] = set()

    @settings(max_examples=STRATEGY_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=STRATEGIES[kind])
    def collect(case):
        seen.update(features(case))

    collect()
    assert not REQUIRED[kind] - seen, f"never generated in {STRATEGY_EXAMPLES} {kind} cases: {REQUIRED[kind] - seen}"


@pytest.mark.parametrize("table", ["oracle.EXPECT", "corruptions.CORRUPTIONS", "strategies.BASE_CASES"])
def test_each_table_by_operation_covers_exactly_the_operations(table):
    """A table keyed by operation is written out by hand: it must name each operation once."""
    from mla_fuse_conformance.cases import corruptions
    from mla_fuse_conformance.declarations.operations import OPERATIONS

    module, _, name = table.partition(".")
    keys = getattr({"oracle": oracle, "corruptions": corruptions, "strategies": strategies}[module], name)
    assert sorted(keys) == sorted(OPERATIONS), f"{table} keys {sorted(keys)} != OPERATIONS"


def test_each_kernel_mutant_class_is_reachable_by_its_spec():
    from mla_fuse_conformance.contract.implementation import _mutant_specs
    from mla_fuse_conformance.mutants import kernels

    for spec in _mutant_specs().values():
        module, _, attribute = spec.partition(":")
        assert getattr(kernels, attribute).name == f"mutant:{attribute.removeprefix('Mutant_')}"
    with pytest.raises(AttributeError, match="Mutant_no_such_bug"):
        kernels.Mutant_no_such_bug  # noqa: B018


def test_every_property_runs_the_edge_cases():
    """T = 0 and T = 1 run in every profile, as explicit examples (not left to chance)."""
    for name, prop in harness.all_properties().items():
        if prop.needs_input_checks or name.partition(":")[0] in EXPLICIT_ONLY_MODULES:
            continue
        tokens = {case.tokens for case in prop.examples}
        assert {0, 1} <= tokens, f"{name} lacks explicit T=0/T=1 examples (strategies.edge_cases)"


@pytest.mark.parametrize("spec", [
    TableSpec("plain", 8, 300, base=500.0),
    TableSpec("deepseek_yarn", 16, 32, yarn_factor=4.0, yarn_mscale=0.707, yarn_attn_factor=0.5),
    TableSpec("deepseek_yarn", 6, 16, dtype="input", yarn_factor=40.0, yarn_mscale_all_dim=1.0),
])
def test_poisoned_tables_hold_the_reference_rows(spec):
    """The cheap builder of large tables computes exactly the rows the reference's builder does."""
    full = build.full_table(spec, torch.bfloat16 if spec.dtype == "input" else torch.float32)
    positions = torch.arange(spec.num_positions)
    sparse = build.table_tensor(dataclasses.replace(spec, poison_unused_rows=True), full.dtype, positions[::3])
    assert torch.equal(sparse[::3], full[::3])
    assert torch.isnan(sparse[1::3].float()).all()


# ---------------------------------------------------------------- the comparisons reject planted errors

PLAIN_MLA = MlaCase(seed=5, tokens=6, heads=2, latent=5, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="auto",
                    num_blocks=3, block_size=4, slots=cases.SlotSpec(6, padding="some"),
                    table=TableSpec("plain", 4, 64), is_neox=False)
REFERENCE = load_implementation("reference")


def _run_reference(case, operation="concat_and_cache_mla_rope_fused"):
    built = build.build(case, "cpu")
    expectation = oracle.expect(operation, built, REFERENCE)
    checks.call(REFERENCE, operation, built.args)
    return built, expectation


def _after(built):
    return {name: buffer.flat.clone() for name, buffer in built.buffers.items()}


def test_the_reference_matches_itself():
    built, expectation = _run_reference(PLAIN_MLA)
    comparisons.assert_matches(built.buffers, _after(built), expectation)


@pytest.mark.parametrize("size", [(4, 3, 5), (1, 7, 2), (6, 1, 1), (3, 0, 4), (2, 2, 2, 3)])
@pytest.mark.parametrize("outer_last", [False, True])
@pytest.mark.parametrize("offset", [0, 17])
def test_index_map_is_each_view_elements_index_in_the_flat_buffer(size, outer_last, offset):
    """``Buffer.index_map`` (computed from the view's geometry) is the view of an ``arange`` over the whole
    buffer, and with leading index tensors the elements they select (empty selections too)."""
    buffer = memory.Buffer("b", 5000, torch.float16, "cpu", 1)
    order = tuple(reversed(range(len(size)))) if outer_last else ()
    buffer.add_view("v", size, tuple(2 * s for s in memory.row_major_strides(size, order)), offset)
    everything = buffer.view("v", torch.arange(buffer.flat.numel()))
    assert torch.equal(buffer.index_map("v"), everything)
    generator = torch.Generator().manual_seed(0)
    for count in range(1, len(size) + 1):
        if all(size[:count]):
            leading = [torch.randint(0, n, (6,), generator=generator) for n in size[:count]]
            for chosen in (leading, [index[:0] for index in leading]):
                assert torch.equal(buffer.index_map("v", *chosen), everything[tuple(chosen)])


def test_a_flipped_sentinel_bit_is_located():
    built, expectation = _run_reference(PLAIN_MLA)
    after = _after(built)
    slots = built.args["slot_mapping"].tolist()
    unused = next(s for s in range(3 * 4) if s not in slots)
    flat = built.index_map("kv_cache")[unused // 4, unused % 4, 0]
    memory.bits(after["kv_cache"])[flat] ^= 1
    with pytest.raises(AssertionError, match=rf"kv_cache\[{unused // 4}, {unused % 4}, 0\]"):
        comparisons.assert_matches(built.buffers, after, expectation)


def test_a_rotated_value_one_ulp_past_the_bound_fails():
    built, expectation = _run_reference(PLAIN_MLA)
    after = _after(built)
    region = next(r for r in expectation.rope if r.label == "rotated q_pe")
    exact, bound = region.exact[0].item(), region.bound[0].item()
    after["q_pe"][region.index[0]] = exact + 2 * bound
    with pytest.raises(AssertionError, match="outside the CONTRACT §5 bound"):
        comparisons.assert_matches(built.buffers, after, expectation)


@pytest.mark.parametrize("fmt, quotient", [
    ("e4m3", 1.0625), ("e4m3", 1.1875), ("e5m2", 1.125), ("e4m3", -3 * 2.0 ** -10),
])
def test_fp8_ties_must_round_to_even(fmt, quotient):
    """At an exact tie the code is pinned: one step away (ties away from zero) fails."""
    exact = torch.tensor([quotient], dtype=torch.float64)
    ref = ref_fp8.encode(exact, fmt)
    away = ((ref.to(torch.int64) & 0x7F) + 1 | (ref.to(torch.int64) & 0x80)).to(torch.uint8)
    buffer = memory.Buffer("cache", 1, torch.uint8, "cpu", 0)
    region = comparisons.Fp8Region("cache", "tie", torch.tensor([0]), ref, ref, ref, fmt)
    outcome = comparisons.Outcome()
    comparisons.check_fp8({"cache": buffer}, {"cache": away}, region, outcome)
    assert outcome.failures and "must be exact" in outcome.failures[0]
    outcome = comparisons.Outcome()
    comparisons.check_fp8({"cache": buffer}, {"cache": ref}, region, outcome)
    assert not outcome.failures


def test_fp8_ordinals_are_adjacent_across_zero_and_saturation():
    codes = torch.tensor([0x81, 0x80, 0x00, 0x01, 0x7E], dtype=torch.uint8)
    assert comparisons.fp8_ordinal(codes).tolist() == [-1, 0, 0, 1, 126]
    assert comparisons.fp8_is_nan(torch.tensor([0x7F, 0xFF, 0x7E], dtype=torch.uint8), "e4m3").tolist() == [
        True, True, False]
    assert comparisons.fp8_is_inf(torch.tensor([0x7C, 0xFC, 0x7B], dtype=torch.uint8), "e5m2").tolist() == [
        True, True, False]


# ---------------------------------------------------------------- found bugs, pinned


def test_reference_rotary_embedding_accepts_zero_tokens():
    """Found by test_rotary_embedding_matches_reference: ``_as_heads`` reshaped with -1, which fails for T = 0."""
    table = torch.ones(1, 2)
    query = torch.empty(0, 1, 2)
    new_query, _ = ref_ops.rotary_embedding(torch.empty(0, dtype=torch.long), query, None, 2, table, False)
    assert new_query.shape == query.shape


def test_reference_rope_passes_the_unrotated_tail_through_bitwise():
    """Found by test_fused_flash_matches_reference: the tail went through a cast that rewrote NaN bits
    (0x7fc0 -> 0xffff in torch's vectorized cast); pass-through must be bitwise."""
    from mla_fuse_reference import rope as ref_rope

    x = torch.ones(1, 1, 64, dtype=torch.bfloat16)
    x[..., 5] = float("nan")  # R = 2: the NaN (0x7fc0) is in the tail; torch's vectorized cast writes 0xffff
    out = ref_rope.rope(torch.tensor([1]), x, ref_rope.plain_cos_sin_cache(2, 4), True)
    assert torch.equal(memory.bits(out[..., 2:]), memory.bits(x[..., 2:]))


# ---------------------------------------------------------------- replaying saved failures


def test_a_saved_failure_replays_exactly(tmp_path, monkeypatch):
    """Fail a property on a mutant, save the failure, replay it in process and with the command line."""
    monkeypatch.setenv(recording.FAILURE_DIR_ENV, str(tmp_path))
    prop = harness.property_named("test_mla:test_fused_mla_matches_reference")
    mutant = load_implementation("mutant:sin_sign_flipped")
    recorder = recording.Recorder()
    with pytest.raises(AssertionError):
        prop.run(mutant, torch.device("cpu"), PLAIN_MLA, recorder=recorder)
    path = recording.save_failure(recorder.last_failure, "property_tests/test_mla.py::x", "ci")
    record = json.loads(path.read_text())
    assert cases.from_jsonable(record["case"]) == PLAIN_MLA
    assert repro.replay(record) == 1
    assert repro.replay(record, impl_spec="mutant:none") == 0
    result = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "repro", str(path)], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 1 and "outside the CONTRACT §5 bound" in result.stderr + result.stdout


def test_cases_round_trip_through_json():
    case = cases.BadInputCase("rope_and_reshape_and_cache_flash", "slot_past_cache", FlashCase(
        seed=3, tokens=2, heads=2, kv_heads=1, head_size=8, value_head_size=3, dtype="float16",
        kv_cache_dtype="fp8_e5m2", num_blocks=2, block_size=3, slots=cases.SlotSpec(2, padding="all"),
        table=TableSpec("deepseek_yarn", 4, 16, yarn_factor=4.0), cache_order=(0, 2, 1),
        cache_place=cases.Placement((1, 0, 0, 2), (1, 0, 0, 1), (0, 2, 1, 3), 3, 1)))
    assert cases.from_json(cases.to_json(case)) == case
    assert eval(repr(case), vars(cases)) == case  # noqa: S307 - the repr is the @example form
    assert math.isfinite(case.base.table.num_positions)
