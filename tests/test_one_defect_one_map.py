"""One defect, one map (docs/REPORT.md "One defect, one map"): a cell one property's map found is
tried first on the next failing properties; where an example of theirs inside it fails the same
way, it is carried there with its rate measured there, not derived again in rounds of its own.

The kernels here are fakes (``run_example`` raising where a planted trigger holds): the map's
mechanics, not a kernel, are under test, in seconds.
"""

from __future__ import annotations

import pathlib

import pytest

from mla_fuse_conformance.commands.conformance_map import diagnosis, known_cells
from mla_fuse_conformance.commands.conformance_map.property_map import map_property
from mla_fuse_conformance.commands.report import document
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running.harness import property_named

MLA_WRITE = "test_mla:test_mla_cache_write_matches_reference"
MLA_FUSED = "test_mla:test_fused_mla_matches_reference"
MLA_INTERACTIONS = "test_interactions:test_mla_cache_write_interactions"
ROPE = "test_rotary_embedding:test_rotary_embedding_matches_reference"


def fake_kernel(*bugs):
    def run(case, *args):
        if any(bug(case) for bug in bugs):
            raise AssertionError("implementation differs from the reference (CONTRACT §5)")
    return run


def fp8_write(case) -> bool:
    """The planted defect shared by every MLA property: a wrong entry wherever an fp8 cache is written."""
    if not getattr(case, "kv_cache_dtype", "auto").startswith("fp8"):
        return False
    relations = diagnosis.relations_of(case) or {}
    return bool(relations.get("some slot written (slot >= 0)"))


def fused_neox(case) -> bool:
    """A second defect, only the fused operation's: NeoX rotation."""
    return hasattr(case, "kv_cache_dtype") and case.is_neox and case.rotary_dim > 0


def mapped(names, run, found=None):
    """The cells of each property's map in turn, each map given the cells the ones before it found."""
    found = [] if found is None else found
    out = {}
    for name in names:
        result = map_property(property_named(name), load_implementation("reference"), "cpu", run, max_examples=40,
                              rounds=4, found=found)
        out[name] = document.cells([result])
        found += [dict(cell, found_by=name) for cell in out[name] if cell["source"] == "shrunk"]
    return out


@pytest.fixture(autouse=True)
def failure_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path))


def test_a_cell_found_for_one_property_is_carried_to_the_next_with_its_own_rate():
    cells = mapped([MLA_WRITE, MLA_INTERACTIONS], fake_kernel(fp8_write))
    first, second = cells[MLA_WRITE], cells[MLA_INTERACTIONS]
    assert first and all(cell["source"] == "shrunk" for cell in first), first
    assert [cell["source"] for cell in second] == ["another property"] * len(second), second
    assert {c["condition"]["text"] for c in second} <= {c["condition"]["text"] for c in first}
    assert all(cell["found_by"] == MLA_WRITE and cell["rate"][0] > 0 for cell in second), second
    assert all(cell["id"].startswith(MLA_INTERACTIONS) for cell in second)  # its own id: --baseline keeps working


def test_a_second_defect_of_the_next_property_is_still_mapped_on_its_own():
    cells = mapped([MLA_WRITE, MLA_FUSED], fake_kernel(fp8_write, fused_neox))
    fused = cells[MLA_FUSED]
    carried = [cell for cell in fused if cell["source"] == "another property"]
    own = [cell for cell in fused if cell["source"] == "shrunk"]
    assert carried and own, fused
    assert any("neox" in cell["condition"]["text"].lower() for cell in own), own


def test_a_condition_on_a_field_the_next_property_lacks_never_holds_there():
    """``query rank not 2`` (a rope case's field): an MLA case has no query rank, so it is not inside
    the cell, although "not 2" would hold for a missing value. Its feature values alone (a cell of
    another property with no condition) hold only where there are some."""
    from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec

    mla = MlaCase(seed=1, tokens=2, heads=1, latent=8, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="auto",
                  num_blocks=2, block_size=4, slots=SlotSpec(2), table=TableSpec("plain", 4, 8))
    entry = {"id": "x", "kind": "wrong result", "found_by": ROPE,
             "condition": {"text": "rank not 2", "data": [["field-not", "rank", ["2"]]], "features": {}}}
    assert not known_cells.KnownCell(entry).holds(mla, False, lambda: {})
    heads = dict(entry, condition={"text": "heads 1", "data": [["field-not", "heads", ["2"]]], "features": {}})
    assert known_cells.KnownCell(heads).holds(mla, False, lambda: {})  # a field it has: judged by its value
    everywhere = dict(entry, condition={"text": "", "data": [], "features": {}})
    assert not known_cells.KnownCell(everywhere).holds(mla, False, lambda: {})
    assert known_cells.KnownCell(dict(everywhere, found_by=None)).holds(mla, False, lambda: {})  # a baseline's


def test_without_the_cells_of_earlier_maps_each_property_derives_its_own():
    """The planted check of the first test: with the carry switched off, the second map re-derives."""
    cells = mapped([MLA_WRITE], fake_kernel(fp8_write))
    again = map_property(property_named(MLA_INTERACTIONS), load_implementation("reference"), "cpu",
                         fake_kernel(fp8_write), max_examples=40, rounds=4)
    assert cells[MLA_WRITE] and all(cell.source == "shrunk" for cell in again.cells)


def test_the_heat_map_colours_every_value_the_condition_admits():
    """Issue 31 item 4: `kv_cache_dtype fp8` red but `fp8_e4m3` green, `padding none` red but `some`
    green, while the cell (an fp8 cache written at all) fails on each. Coloured by what the condition
    admits, every fp8 name and every padding that writes a slot is red; auto and all-padded are not."""
    from mla_fuse_conformance.commands.report.heatmap import PASSING, squares

    cells = mapped([MLA_WRITE], fake_kernel(fp8_write))[MLA_WRITE]
    assert len(cells) == 1 and cells[0]["admits"], cells
    admitted = cells[0]["admits"]
    assert {"fp8", "fp8_e4m3", "fp8_e5m2"} <= set(admitted["kv_cache_dtype"]) and "auto" not in admitted["kv_cache_dtype"]
    assert {"none", "some"} <= set(admitted["padding"]) and "all" not in admitted["padding"], admitted
    report = {"cells": cells, "coverage": {"axes": {"kv_cache_dtype": {"auto": 5, "fp8": 5, "fp8_e4m3": 5},
                                                    "padding": {"none": 5, "some": 5, "all": 5}}}}
    row = {(square.axis, square.value): square for square in squares(report, ["concat_and_cache_mla"], {})[0]}
    assert row[("kv_cache_dtype", "fp8_e4m3")].colour != PASSING and row[("padding", "some")].colour != PASSING
    assert row[("kv_cache_dtype", "auto")].colour == PASSING and row[("padding", "all")].colour == PASSING


def test_a_carried_cell_confirmed_by_the_test_run_is_not_run_again_in_the_search():
    """Confirmed with the property test's failing case inside it, the carried cell's cases are left out
    of the search unrun (rejected before the kernel runs): the only runs inside it are that one case
    and the rate's sample. Planted: without the test run's failing cases (``known``) nothing is
    confirmed before the search, which then runs every fp8 example of the covering array."""
    from mla_fuse_conformance.cases.interactions import interaction_cases

    found = []
    mapped([MLA_WRITE], fake_kernel(fp8_write), found)
    failing = next(case for case in interaction_cases("concat_and_cache_mla") if fp8_write(case))
    inside = []

    def counting(case, *args):
        inside.append(fp8_write(case))
        return fake_kernel(fp8_write)(case, *args)

    def runs_inside(known):
        inside.clear()
        result = map_property(property_named(MLA_INTERACTIONS), load_implementation("reference"), "cpu", counting,
                              max_examples=40, rounds=4, found=found, known=known)
        assert [cell.source for cell in result.cells] == ["another property"], result.cells
        return sum(inside)

    fp8_examples = sum(map(fp8_write, interaction_cases("concat_and_cache_mla")))
    assert runs_inside((failing,)) <= 1 + diagnosis.CARRIED_RATE_EXAMPLES < fp8_examples
    assert runs_inside(()) >= fp8_examples


def test_a_map_out_of_time_mid_round_keeps_the_cells_it_completed():
    """``verify --map-seconds`` spent during a round (``OutOfTime`` from ``run_example``, as
    ``Executor.run`` raises it): the map stops there, its completed cell kept, marked stopped at
    the budget; a round cut before its search met a failure adds no cell (one cut while a cell is derived
    keeps that cell, cut short: tests/test_map_cut_short.py)."""
    from mla_fuse_conformance.running.executor import OutOfTime

    steps = []

    def run(case, *args):
        if any(step.startswith("round 2/") for step in steps):
            raise OutOfTime()
        fake_kernel(fp8_write, fused_neox)(case, *args)

    result = map_property(property_named(MLA_FUSED), load_implementation("reference"), "cpu", run, max_examples=40,
                          rounds=4, on_step=steps.append)
    assert result.stopped == "budget" and not result.complete, (result.stopped, steps)
    assert len(result.cells) == 1 and result.cells[0].features, result.cells
    assert "stopped at the map's time budget" in result.lines()[0], result.lines()


def test_a_carried_cell_cut_while_its_rate_is_measured_is_kept_with_the_rate_not_measured():
    """``verify --map-seconds`` spent while a cell carried from another property has its rate measured here: the
    cell is kept (its condition is the other property's, its failing example this property's, replayable), read
    ``failure rate not measured (the map's time budget ran out first)``, cut short (``cut_short.py``: no id in
    ``failing``); the map says it stopped at the budget. Before, the carried cell was lost with the budget."""
    from mla_fuse_conformance.commands.conformance_map import cut_short
    from mla_fuse_conformance.running.executor import OutOfTime

    found = [dict(cell, found_by=MLA_WRITE) for cell in mapped([MLA_WRITE], fake_kernel(fp8_write))[MLA_WRITE]]
    steps = []

    def run(case, *args):
        if any("measuring its failure rate here" in step for step in steps):
            raise OutOfTime()
        fake_kernel(fp8_write)(case, *args)

    result = map_property(property_named(MLA_INTERACTIONS), load_implementation("reference"), "cpu", run,
                          max_examples=40, rounds=4, found=found, on_step=steps.append)
    cells = document.cells([result])
    assert result.stopped == "budget" and not result.complete, (result.stopped, steps)
    assert [cell["source"] for cell in cells] == ["another property"] * len(cells) and cells, cells
    assert all(cell["cut_short"] == cut_short.STEPS["rate"] and not cell["rate"] for cell in cells), cells
    assert any("failure rate not measured (the map's time budget ran out first)" in line for line in result.lines())
    assert all(pathlib.Path(cell.file).is_file() for cell in result.cells), result.cells  # replay files
