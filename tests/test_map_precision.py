"""The map's precision, tested the way the suite tests kernels: bugs planted whose triggers are known
exactly, of several kinds (a value threshold with a sign, a single size, a layout, a dtype name); each
map must give a cell that names the trigger, and no conjunct that is false of it (docs/REPORT.md
"cells": ``rotary_dim not 2`` where the bug fails with rotary_dim 2 is such a conjunct).

"False of the trigger" is checked on cases: random cases of the property moved onto the trigger
(the ground truth below, computed from the built tensors without the map's relations) must lie
inside every conjunct of every cell. One of those cases is given to the map as the test run's failing
example (``known``: diagnosed where the map's own 40 examples meet no failure, as ``verify`` does),
so a test does not hang on the search drawing a trigger. The value threshold is a torch adapter
(``data/planted/clamp_240.py``: e4m3's x / scale clamped to [-240, 448]); the others are fakes
(``run_example`` raising where the trigger holds: the map's mechanics, not a kernel, in seconds). The
multiplied fp8 scale is right at scale 1 only: its cell must exclude that value (``scale not 1``,
``conformance_map/holds.py``), whether the rounds find it once or split it in two. Two rounding orders
(SGLang's fused write, docs/THIRD_PARTY.md): a reciprocal multiply ``x * (1 / scale)`` differs from the
division only next to an fp8 tie, and a fused write quantizing its float32 rotation differs from one
quantizing the written-back key only where the two round to different codes; their ground truths are
computed here in torch (float32 arithmetic, torch's fp8 cast), not with the map's relations.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from mla_fuse_conformance.cases import fields, tensors
from mla_fuse_conformance.cases.cache_axes import scale_of
from mla_fuse_conformance.cases.value_relations import NEAR_TIE, ROTATED_KEY_CODE
from mla_fuse_conformance.commands.conformance_map import diagnosis
from mla_fuse_conformance.commands.conformance_map.property_map import map_property
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running.harness import property_named

MLA_WRITE = "test_mla:test_mla_cache_write_matches_reference"
FUSED_MLA = "test_mla:test_fused_mla_matches_reference"
PLANTED = pathlib.Path(__file__).parent / "data" / "planted"
BELOW_FNUZ = ["relation", "a written x/scale rounding below -240 (e4m3fnuz's max)", "yes"]


def built_and_written_rows(case) -> tuple:
    """The case built on the CPU, and the token rows its cache write stores (slot >= 0)."""
    built = tensors.build(diagnosis._base(case), "cpu")
    slots = built.args["slot_mapping"].long()
    rows = torch.arange(min(slots.numel(), case.tokens))
    return built, rows[slots[: rows.numel()] >= 0]


def written(case) -> list[torch.Tensor]:
    """The rows of kv_c and k_pe a cache write stores, x / scale in float32 for an fp8 cache."""
    built, rows = built_and_written_rows(case)
    scale = built.args["scale"].float() if case.kv_cache_dtype.startswith("fp8") else 1.0
    return [built.args[name][rows].float() / scale for name in ("kv_c", "k_pe")]


def clamp_240(case) -> bool:
    """The clamp's trigger: an e4m3 cache and a written x / scale that rounds below -240 (-248 is a tie
    that rounds to -256, the even code)."""
    return case.kv_cache_dtype in ("fp8", "fp8_e4m3") and any(bool((x <= -248).any()) for x in written(case))


def some_written(case) -> bool:
    return any(x.numel() for x in written(case))


def block_16(case) -> bool:
    return case.block_size == 16 and some_written(case)


def kv_c_strided(case) -> bool:
    return not tensors.build(case, "cpu").args["kv_c"].is_contiguous() and some_written(case)


def scale_not_1(case) -> bool:
    """A kernel that multiplies by the scale instead of dividing: right exactly where the scale is 1."""
    return case.kv_cache_dtype.startswith("fp8") and scale_of(case) == "other" and some_written(case)


def e5m2(case) -> bool:
    return case.kv_cache_dtype == "fp8_e5m2" and some_written(case)


def _e4m3(quotient: torch.Tensor) -> torch.Tensor:
    """torch's fp8 cast of a float32 quotient, saturated first (the cast gives NaN past the max)."""
    return quotient.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def reciprocal_scale(case) -> bool:
    """A write quantizing ``x * (1 / scale)`` in float32: wrong where that product and the quotient
    ``x / scale`` get different e4m3 codes."""
    if case.kv_cache_dtype not in ("fp8", "fp8_e4m3"):
        return False
    built, rows = built_and_written_rows(case)
    scale = built.args["scale"].float()
    return any(bool((_e4m3(x * (1 / scale)) != _e4m3(x / scale)).any())
               for x in (built.args[name][rows].float() for name in ("kv_c", "k_pe")))


def rotation_quantized(case) -> bool:
    """A fused MLA write caching the e4m3 code of k_pe's float32 rotation, not of the rotated k_pe it
    writes back (rounded to its dtype): wrong where the two codes differ (cos/sin from the table, float64)."""
    if case.kv_cache_dtype not in ("fp8", "fp8_e4m3"):
        return False
    built, rows = built_and_written_rows(case)
    k_pe, half = built.args["k_pe"][rows], case.rotary_dim // 2
    table = built.args["cos_sin_cache"].double()[built.args["positions"].long()[rows]]
    cos, sin = table[:, :half], table[:, half:]
    first = torch.arange(half) if case.is_neox else 2 * torch.arange(half)
    second = first + half if case.is_neox else first + 1
    x = k_pe.double()
    rotated = x.clone()
    rotated[:, first] = x[:, first] * cos - x[:, second] * sin
    rotated[:, second] = x[:, second] * cos + x[:, first] * sin
    scale = built.args["scale"].float()
    written_back = rotated.to(k_pe.dtype).float() / scale
    return bool((_e4m3(written_back) != _e4m3(rotated.float() / scale)).any())


def fake_kernel(trigger):
    def run(case, *args):
        if trigger(diagnosis._base(case)):
            raise AssertionError("implementation differs from the reference (CONTRACT §5)")
    return run


def moved_onto(field: str, value):
    return lambda case: fields.vary(case, field, value)


def triggered(prop, impl, trigger, move=lambda case: case, count: int = 30, draws: int = 4) -> list:
    """Random cases of ``prop`` (moved by ``move``) on which ``trigger`` holds (of ``count * draws``)."""
    found = []

    @settings(max_examples=count * draws, phases=[Phase.generate], database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=prop.strategy_for(impl))
    def draw(case):
        case = move(diagnosis._base(case))
        if case is not None and len(found) < count and prop.allows(impl, case) and trigger(case):
            found.append(case)
    draw()
    assert len(found) >= count // 3, f"too few cases with the trigger drawn: {len(found)}"
    return found


def assert_precise(found, named, trigger_cases, every_conjunct: bool = True):
    """A cell whose condition holds ``named`` (a conjunct, or a predicate on one), and every conjunct of
    every cell (``every_conjunct=False``: the named one) true of every case with the trigger."""
    text = "\n".join(found.lines())
    conditions = [cell.diagnosis["condition"] for cell in found.cells if cell.diagnosis]
    assert any(any(named(c) if callable(named) else c == named for c in condition) for condition in conditions), text
    for condition in conditions:
        for conjunct in condition if every_conjunct else [c for c in condition if c == named]:
            outside = [case for case in trigger_cases if not diagnosis.inside([conjunct], case)]
            assert not outside, f"{conjunct} is false of a case with the trigger: {outside[0]}\n{text}"


@pytest.fixture(autouse=True)
def failure_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path))


def test_a_clamp_at_minus_240_gets_a_cell_naming_a_negative_value_beyond_e4m3fnuz_range(monkeypatch):
    """The issue's bug: its cell said ``rotary_dim not 2; values.midpoint_fraction 0; values.log2_magnitude
    8.8 or 8``, all false of it, and not the sign. Now: a written x/scale rounding below -240, e4m3."""
    monkeypatch.syspath_prepend(str(PLANTED))
    prop, impl = property_named(MLA_WRITE), load_implementation("clamp_240:Kernels")
    cases = triggered(prop, impl, clamp_240, moved_onto("kv_cache_dtype", "fp8"))
    found = map_property(prop, impl, "cpu", lambda case: prop.run(impl, torch.device("cpu"), case),
                         max_examples=40, rounds=2, known=cases[:1])
    assert_precise(found, BELOW_FNUZ, cases)
    assert not any("midpoint" in cell.title() or "rotary_dim" in cell.title() for cell in found.cells)


@pytest.mark.parametrize("trigger, named, move, examples", [
    (block_16, ["field", "block_size", ["16"]], moved_onto("block_size", 16), 40),
    (kv_c_strided, ["relation", "kv_c contiguous", "no"], lambda case: dataclasses.replace(
        case, kv_packed=False, kv_c_place=dataclasses.replace(case.kv_c_place, pad=(0, 3), offset=(0, 1))), 40),
    (e5m2, ["field", "kv_cache_dtype", ["fp8_e5m2"]], moved_onto("kv_cache_dtype", "fp8_e5m2"), 40),
    (scale_not_1, ["axis-not", "scale", ["1"]], moved_onto("kv_cache_dtype", "fp8"), 40),
], ids=["a single size", "a layout", "a dtype name", "a value excluded"])
def test_a_planted_trigger_is_named_and_no_conjunct_is_false_of_it(trigger, named, move, examples):
    prop, impl = property_named(MLA_WRITE), load_implementation("reference")
    cases = triggered(prop, impl, trigger, move)
    found = map_property(prop, impl, "cpu", fake_kernel(trigger), max_examples=examples, rounds=2, known=cases[:1])
    assert_precise(found, named, cases)


def test_a_reciprocal_scale_gets_a_cell_naming_the_quotients_near_an_fp8_tie():
    """SGLang's third finding, planted: its cells said ``a written x/scale in the fp8 subnormal range``
    and ``tokens 11 or 8 or 10 or 12 or 17``, neither the trigger. Now: within 2 float32 ulps of a tie, a
    conjunct true of every case with the trigger (the failure needs it)."""
    prop, impl = property_named(MLA_WRITE), load_implementation("reference")
    cases = triggered(prop, impl, reciprocal_scale, lambda case: fields.vary(
        fields.vary(case, "kv_cache_dtype", "fp8"), "dtype", "float32"), draws=16)  # 1 in 40: rare
    found = map_property(prop, impl, "cpu", fake_kernel(reciprocal_scale), max_examples=40, rounds=2,
                         known=cases[:1])
    # a rare failure (a code flips at some ties only): other conjuncts come from moves that happened to pass
    assert_precise(found, ["relation", NEAR_TIE, "yes"], cases, every_conjunct=False)


def test_a_fused_write_quantizing_its_float32_rotation_gets_a_cell_naming_the_two_codes():
    """SGLang's second finding (the cache holds the code of the fp32 rotation, not of the key written
    back), planted in the fused MLA write: its cell was cut short with no condition. Now: the relation
    that is exactly its trigger."""
    prop, impl = property_named(FUSED_MLA), load_implementation("reference")
    cases = triggered(prop, impl, rotation_quantized, moved_onto("kv_cache_dtype", "fp8"),
                      draws=8)
    found = map_property(prop, impl, "cpu", fake_kernel(rotation_quantized), max_examples=40, rounds=2,
                         known=cases[:1])
    assert_precise(found, ["relation", ROTATED_KEY_CODE, "yes"], cases)


def test_an_unfused_write_is_never_explained_by_a_rotation():
    """The built case is the same for both MLA writes, so the rotation relation is computed for the
    unfused one too; the same planted trigger on the unfused write (its failing case drawn by the fused
    write's strategy: the unfused one draws a table that leaves the key as it is) must not be named by it."""
    prop, impl = property_named(MLA_WRITE), load_implementation("reference")
    cases = triggered(property_named(FUSED_MLA), impl, rotation_quantized, moved_onto("kv_cache_dtype", "fp8"),
                      draws=8)
    assert prop.allows(impl, cases[0])
    found = map_property(prop, impl, "cpu", fake_kernel(rotation_quantized), max_examples=40, rounds=1,
                         known=cases[:1])
    assert found.cells and not any(ROTATED_KEY_CODE in line for line in found.lines()), "\n".join(found.lines())


def short_slots(case) -> bool:
    return case.slots.length < case.tokens


def fp8_half_the_data(case) -> bool:
    """A partial trigger: the cache dtype named ``fp8``, where the first written latent value is positive
    (about half the data)."""
    rows = written(case)[0] if case.kv_cache_dtype == "fp8" else None
    return rows is not None and rows.numel() > 0 and bool(rows.reshape(-1)[0] > 0)


def test_a_cell_is_derived_outside_the_cells_found_before_it():
    """Two defects: a short ``slot_mapping`` fails always, the cache dtype ``fp8`` for
    half the data. The
    second cell's ``kv_cache_dtype fp8`` was checked on cases outside it that failed by the first defect, as often as
    inside: dropped (SGLang's reciprocal scale lost its near-tie relation to the short slot mapping's
    crashes). Cases inside a cell found before do not apply to the next one."""
    prop, impl = property_named(MLA_WRITE), load_implementation("reference")
    either = fake_kernel(lambda case: short_slots(case) or fp8_half_the_data(case))
    found = map_property(prop, impl, "cpu", either, max_examples=40, rounds=3)
    text = "\n".join(found.lines())
    first = found.cells[0].diagnosis["condition"]
    assert ["relation", "slot_mapping length == tokens", "no"] in first, text
    named = [cell.diagnosis for cell in found.cells[1:] if cell.diagnosis
             and any(entry["conjunct"][1] == "kv_cache_dtype" for entry in cell.diagnosis["necessity"] or [])]
    assert named, text
    verdicts = [entry["verdict"] for entry in named[0]["necessity"] if entry["conjunct"][1] == "kv_cache_dtype"]
    assert "dropped" not in verdicts and any(c[1] == "kv_cache_dtype" for c in named[0]["condition"]), text
