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
``conformance_map/holds.py``), whether the rounds find it once or split it in two.
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings

from mla_fuse_conformance.cases import fields, tensors
from mla_fuse_conformance.cases.cache_axes import scale_of
from mla_fuse_conformance.commands.conformance_map import diagnosis
from mla_fuse_conformance.commands.conformance_map.property_map import map_property
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running.harness import property_named

MLA_WRITE = "test_mla:test_mla_cache_write_matches_reference"
PLANTED = pathlib.Path(__file__).parent / "data" / "planted"
BELOW_FNUZ = ["relation", "a written x/scale rounding below -240 (e4m3fnuz's max)", "yes"]


def written(case) -> list[torch.Tensor]:
    """The rows of kv_c and k_pe a cache write stores, x / scale in float32 for an fp8 cache."""
    built = tensors.build(diagnosis._base(case), "cpu")
    slots = built.args["slot_mapping"].long()
    rows = torch.arange(min(slots.numel(), case.tokens))
    rows = rows[slots[: rows.numel()] >= 0]
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


def fake_kernel(trigger):
    def run(case, *args):
        if trigger(diagnosis._base(case)):
            raise AssertionError("implementation differs from the reference (CONTRACT §5)")
    return run


def moved_onto(field: str, value):
    return lambda case: fields.vary(case, field, value)


def triggered(prop, impl, trigger, move=lambda case: case, count: int = 30) -> list:
    """Random cases of ``prop`` (moved by ``move``) on which ``trigger`` holds."""
    found = []

    @settings(max_examples=count * 4, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(case=prop.strategy_for(impl))
    def draw(case):
        case = move(diagnosis._base(case))
        if case is not None and len(found) < count and prop.allows(impl, case) and trigger(case):
            found.append(case)
    draw()
    assert len(found) >= count // 3, f"too few cases with the trigger drawn: {len(found)}"
    return found


def assert_precise(found, named, trigger_cases):
    """A cell whose condition holds ``named`` (a conjunct, or a predicate on one), and every conjunct of
    every cell true of every case with the trigger."""
    text = "\n".join(found.lines())
    conditions = [cell.diagnosis["condition"] for cell in found.cells if cell.diagnosis]
    assert any(any(named(c) if callable(named) else c == named for c in condition) for condition in conditions), text
    for condition in conditions:
        for conjunct in condition:
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
