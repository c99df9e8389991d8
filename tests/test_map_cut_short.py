"""A map whose time budget runs out while its first cell is being derived keeps that cell, cut short
(``conformance_map/cut_short.py``; issue 43): its failing case as far as it shrank, its replay file,
and a condition of only what was shown by then, each conjunct not checked read ``(not shown
needed)``, no rate and no exclusion that was not measured; the console, report.json, the page and
summary.md say where it was cut short. Before, such a map read ``0 failing cell(s)``.

The budget is an ``OutOfTime`` (as ``Executor.run`` raises it when ``--map-seconds`` is spent)
raised at a chosen step of the first cell's derivation; the kernel is ``SecondHeadsWrong``
(tests/test_conformance_map.py: rank-3 queries with more than one head scaled), run in-process,
so each replay file is replayed against it for real."""

from __future__ import annotations

import json

import pytest
import torch
from report_pages import report as page_report

from mla_fuse_conformance.commands.conformance_map import cut_short, holds, necessity
from mla_fuse_conformance.commands.conformance_map.baseline import failed_test_id, failing_ids
from mla_fuse_conformance.commands.conformance_map.diagnosis import NOT_CHECKED, Diagnosis
from mla_fuse_conformance.commands.conformance_map.identity import cut_short_note
from mla_fuse_conformance.commands.conformance_map.property_map import map_property
from mla_fuse_conformance.commands import progress
from mla_fuse_conformance.commands.report import document, html, markdown
from mla_fuse_conformance.commands.verify import maps
from mla_fuse_conformance.commands.report.defects import defects
from mla_fuse_conformance.commands.report.markup import text
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running import replay as repro
from mla_fuse_conformance.running.executor import OutOfTime
from mla_fuse_conformance.running.harness import property_named
from test_cells_hold import NEGATIVE, POSITIVE, negative_written
from test_conformance_map import ROPE_PROPERTY, user_dir  # noqa: F401 - the fixture, with its adapters
from test_map_precision import MLA_WRITE, fake_kernel, triggered

NECESSITY = "a conjunct judged"  # told (by this test) when the necessity check reaches its first verdict


class Budget:
    """The map's ``run_example`` and ``on_step``: runs the planted kernel, and raises ``OutOfTime`` at
    the ``after + 1``-th example once a step containing ``step`` was told (``"shrinking"``: at the first
    example after the search's first failure, which hypothesis is then shrinking; None: never)."""

    def __init__(self, prop, impl, step: str | None, after: int = 0) -> None:
        self.prop, self.impl, self.step, self.after = prop, impl, step, after
        self.steps: list[str] = []
        self.counted, self.failed = 0, False

    def __call__(self, case) -> None:
        if self.step == "shrinking" and self.failed:
            raise OutOfTime()
        if self.step not in (None, "shrinking") and any(self.step in step for step in self.steps):
            self.counted += 1
            if self.counted > self.after:
                raise OutOfTime()
        try:
            self.prop.run(self.impl, torch.device("cpu"), case)
        except AssertionError:
            self.failed = True
            raise


def mapped(monkeypatch, step: str | None, after: int = 0):
    impl, prop = load_implementation("adapters_here:SecondHeadsWrong"), property_named(ROPE_PROPERTY)
    budget = Budget(prop, impl, step, after)
    judged = necessity.fails_less_often

    def marked(*args):  # the necessity check tells no step of its own: its first verdict told here
        budget.steps.append(NECESSITY)
        return judged(*args)

    monkeypatch.setattr(necessity, "fails_less_often", marked)
    return map_property(prop, impl, "cpu", budget, max_examples=40, rounds=2, on_step=budget.steps.append)


def failed_test(cell) -> dict:
    """An outcomes.jsonl line of a property test that failed with this cell's failing case."""
    record = json.loads(open(cell.file).read())
    return {"outcome": "failed", "nodeid": "properties/test_rotary_embedding.py::test_rotary_embedding_matches_reference",
            "failure": {"property": record["property"], "kind": record["kind"], "features": record["features"]}}


def views(found) -> tuple[dict, str, str]:
    """The map's report.json cell, and the page and summary.md of a report holding it."""
    cells = document.cells([found])
    shown = page_report(cells=cells, defects=defects(cells))
    return cells[0], html.render(shown), markdown.render(shown)


@pytest.mark.parametrize("step, budget_step, after", [
    ("shrinking", "shrinking", 0),
    ("feature values", "finding its feature values", 3),
    ("trigger", "finding its trigger", 5),
    ("rate", "measuring its failure rate", 3),
    ("necessity", NECESSITY, 0),
    ("holds", "running it at each value it admits", 2),
])
def test_a_budget_spent_while_the_first_cell_is_derived_keeps_it_cut_short(user_dir, monkeypatch, step,  # noqa: F811
                                                                           budget_step, after, no_kernel_paths):
    found = mapped(monkeypatch, budget_step, after)
    assert found.stopped == "budget" and not found.complete
    assert len(found.cells) == 1, found.lines()
    cell = found.cells[0]
    diagnosis = Diagnosis.from_dict(cell.diagnosis)
    assert diagnosis.cut_short == cut_short.STEPS[step], diagnosis.cut_short
    note = cut_short_note(cut_short.STEPS[step])
    lines = "\n".join(found.lines())
    assert found.lines()[0].startswith(f"{ROPE_PROPERTY}: 1 failing cell(s)") and note in lines, lines

    # no more than was shown: each conjunct not checked marked so, no exclusion, no rate not measured
    verdicts = {json.dumps(entry["conjunct"]): entry["verdict"] for entry in diagnosis.necessity}
    assert set(verdicts) == {json.dumps(conjunct) for conjunct in diagnosis.condition}, diagnosis
    unchecked = [name for name, verdict in verdicts.items() if verdict == NOT_CHECKED]
    assert cell.title().count("(not shown needed)") == len(unchecked), cell.title()
    assert not any(verdict == "excluded" for verdict in verdicts.values())
    assert not any(kind == "axis-not" for kind, _, _ in diagnosis.condition)
    if step in ("shrinking", "feature values", "trigger", "rate"):
        assert diagnosis.rate is None and "the map's time budget ran out first" in diagnosis.rate_text()
        assert len(unchecked) == len(diagnosis.condition)
    if step == "shrinking":
        assert diagnosis.condition == [] and cell.title() == "no condition established" and cell.features == {}
    if step == "trigger":
        assert diagnosis.condition == [["axis", "query rank", ["3"]], ["axis", "heads", [">1"]]]
    if step == "necessity":
        assert 0 < len(unchecked) < len(diagnosis.condition), diagnosis.necessity
    if step == "holds":
        assert not unchecked and diagnosis.rate[0] == diagnosis.rate[1] > 0
    record = json.loads(open(cell.file).read())
    assert all(len(values) == 1 and record["features"][axis] == values[0] for axis, values in diagnosis.admits.items())

    # its replay line reproduces the failure, which the reference passes
    assert f"replay: PYTHONPATH=" in lines and cell.file in lines
    assert record["cut_short"] == cut_short.STEPS[step]
    assert repro.replay(record) == repro.REPRODUCED
    assert repro.replay(record, impl_spec="reference") == repro.PASSED

    # report.json, the page and summary.md say so; no failing test is counted as this cell's
    entry, page, summary = views(found)
    assert entry["cut_short"] == cut_short.STEPS[step] and entry["replay"]["file"] == cell.file
    assert f'data-cut-short="{cut_short.STEPS[step]}"' in page and text(note) in page and note in summary
    outcome = failed_test(cell)
    assert failing_ids([entry], [outcome]) == [failed_test_id(outcome)]
    assert document.cell_of(outcome["failure"], [entry]) is None


def test_with_budget_enough_the_cell_is_diagnosed_to_the_end_and_not_marked(user_dir, monkeypatch):  # noqa: F811
    found = mapped(monkeypatch, None)
    assert found.complete and found.stopped is None and len(found.cells) == 1, found.lines()
    cell = found.cells[0]
    diagnosis = Diagnosis.from_dict(cell.diagnosis)
    assert diagnosis.cut_short is None and diagnosis.rate[0] == diagnosis.rate[1] > 0
    assert not any(entry["verdict"] == NOT_CHECKED for entry in diagnosis.necessity)
    assert "(not shown needed)" not in cell.title() and "cut short" not in "\n".join(found.lines())
    assert "cut_short" not in json.loads(open(cell.file).read())
    entry, page, summary = views(found)
    assert entry["cut_short"] is None and "data-cut-short" not in page and "cut short" not in summary
    outcome = failed_test(cell)
    assert failing_ids([entry], [outcome]) == [entry["id"]]
    assert document.cell_of(outcome["failure"], [entry]) == entry["id"]


def test_a_budget_spent_after_the_holds_check_narrowed_a_cell_keeps_it_as_measured_before(tmp_path, monkeypatch):
    """A kernel that loses the sign (``test_cells_hold.negative_written``): the holds check moves the
    failing case's values off each sign, shows ``a written value negative: yes`` (``excluded``) and
    drops the positive one, and the budget is spent while the narrowed cell's rate is measured again.
    The cell keeps the condition, verdicts and rate measured before that step, nothing the step
    changed without its rate (planted: the diagnosis as the cut step left it)."""
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path))
    prop, impl = property_named(MLA_WRITE), load_implementation("reference")
    known = triggered(prop, impl, negative_written, count=3)[:1]
    narrowed, measured, steps = [], holds.measure, []

    def measure(prop, impl, strategy, run_example, condition, *args, **kwargs):
        narrowed.append(condition)
        return measured(prop, impl, strategy, run_example, condition, *args, **kwargs)

    def run(case, *args):
        if narrowed:
            raise OutOfTime()
        fake_kernel(negative_written)(case, *args)

    monkeypatch.setattr(holds, "measure", measure)
    found = map_property(prop, impl, "cpu", run, max_examples=40, rounds=1, known=known, on_step=steps.append)
    assert narrowed and NEGATIVE in narrowed[0] and POSITIVE not in narrowed[0], narrowed  # shown, not measured
    assert steps[-1].endswith("running it at each value it admits") and len(found.cells) == 1, found.lines()
    diagnosis = Diagnosis.from_dict(found.cells[0].diagnosis)
    assert diagnosis.cut_short == cut_short.STEPS["holds"] and diagnosis.rate[0] == diagnosis.rate[1] > 0
    assert POSITIVE in diagnosis.condition and "a written value positive: yes (not shown needed)" in diagnosis.describe()
    assert not any(entry["verdict"] == "excluded" or "moved_to" in entry for entry in diagnosis.necessity)


def test_verify_s_map_keeps_the_cell_its_budget_cut_while_shrinking(user_dir):  # noqa: F811
    """``verify``'s map of one property (``verify/maps.map_one``: each example given the seconds left,
    ``Executor.run``'s ``budget``), here one second an example once the first failure was met: the
    budget runs out while hypothesis shrinks it, and the map has that cell, cut short, with a replay
    file that reproduces; its printed line says so."""
    impl, prop = load_implementation("adapters_here:SecondHeadsWrong"), property_named(ROPE_PROPERTY)
    clock, failed, printed = [0.0], [], []

    class Budgeted:  # Executor.run's budget: OutOfTime when the caller's seconds are spent
        def run(self, name, case, within_limits=True, budget=None):
            if budget is not None and budget <= 0:
                raise OutOfTime()
            clock[0] += 1.0 if failed else 0.0
            try:
                prop.run(impl, torch.device("cpu"), case)
            except AssertionError:
                failed.append(case)
                raise

    found = maps.map_one(prop.name, impl, "cpu", Budgeted(), [], 40, 2, (), progress.Progress(printed.append, False),
                         5.0, lambda: clock[0])
    assert found.stopped == "budget" and len(found.cells) == 1, found.lines()
    assert found.cells[0].diagnosis["cut_short"] == cut_short.STEPS["shrinking"]
    assert printed[-1].endswith(": 1 failing cells\n"), printed
    assert repro.replay(json.loads(open(found.cells[0].file).read())) == repro.REPRODUCED


def test_a_crashed_worker_is_named_so_in_the_failing_id():
    """flash-attn's int32 defect crashes the pytest-xdist worker running an address check, which reports the
    phase as ``???``: the failing id read ``failed test (???)``; it says ``crashed``."""
    outcome = {"nodeid": "properties/test_large_addresses.py::test_query_rows_a_huge_stride_apart",
               "outcome": "failed", "when": "???", "failure": None}
    assert failed_test_id(outcome) == ("test_large_addresses:test_query_rows_a_huge_stride_apart | failed test "
                                       "(crashed) | test_large_addresses.py::test_query_rows_a_huge_stride_apart")
