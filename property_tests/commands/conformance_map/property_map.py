"""The conformance map of a failing property (the declared limits' check: ``limits.py``).

A failing property says little by itself ("rotary_embedding: FAIL"). The map says which feature
values fail and which pass, each failing cell with its own replay file:

1. Search the property (hypothesis, ci settings) within the implementation's declared limits.
2. On a failure, take hypothesis' shrunk case and find the features the failure needs: move the
   case along each axis to every other allowed value (``features.Axis.set``, same seed); a value is
   part of the failing cell when moving it away makes the example pass. The cell is the
   conjunction, e.g. ``query rank 3, heads >1``; it gets a failure file.
3. Search again with every case inside a known cell rejected, until a search passes (or
   ``rounds`` cells were found); a new cell is derived on cases outside the cells found before it
   (a case inside one fails by its defect). The passing examples' feature values are the rest of the map.

Every example runs in an ``executor.Executor`` child, so a crash is a failure of its cell (and is
shrunk like one) instead of the end of the run.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
from typing import Callable

from hypothesis import HealthCheck, Verbosity, given, reject, settings
from hypothesis.errors import FlakyFailure, Unsatisfiable, UnsatisfiedAssumption

from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import failure_text, recording
from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.running.executor import ChildNotProvided, OutOfTime
from mla_fuse_conformance.cases.features import AXIS, axes_of, describe, features
from mla_fuse_conformance.commands.conformance_map import diagnosis as diagnosing
from mla_fuse_conformance.commands.conformance_map.diagnosis import _base
from mla_fuse_conformance.commands.conformance_map import known_cells
from mla_fuse_conformance.commands.conformance_map import cut_short, holds, refinement
from mla_fuse_conformance.commands.conformance_map.admits import admitted
from mla_fuse_conformance.commands.conformance_map.identity import cut_short_note

FAILURES = diagnosing.FAILURES
STOPPED_AT = {"budget": "the map's time budget (--map-seconds)"}
SOURCE_NOTES = {"test run": " (from the test run's failing example, not shrunk)",
                known_cells.SOURCE: " (known: the baseline's cell, its condition and rate; this run's failing "
                                    "example inside it below)",
                known_cells.CARRIED: " (found first for {found_by}: the same condition confirmed here, its rate "
                                     "measured here)"}


@dataclasses.dataclass
class Cell:
    """Feature values a failure needs, and how it failed (``file``: its replay file; ``error``: the
    headline and the worst elements, ``failure_text.excerpt``; ``worst``: those elements as data)."""

    features: dict[str, str]
    kind: str
    error: str
    file: str
    diagnosis: dict | None = None  # diagnosis.Diagnosis as a dict: the trigger in the case's own fields
    source: str = "shrunk"  # "shrunk" (hypothesis' shrunk case), "test run" (the property test's example),
    # "baseline" (a known cell of --baseline, confirmed by this run's example: its condition and rate the baseline's)
    # or "another property" (a cell this run found for ``found_by``, confirmed in this property: one defect, one map)
    worst: list[dict] | None = None  # comparisons.Outcome.worst of its failure (a wrong result), else None
    found_by: str | None = None

    def title(self) -> str:
        if self.diagnosis is None:
            return describe(self.features)
        return diagnosing.Diagnosis.from_dict(self.diagnosis).describe()


@dataclasses.dataclass
class PropertyMap:
    property: str
    operations: tuple[str, ...]
    cells: list[Cell]
    passing: dict[str, dict[str, int]]  # axis -> value -> passing examples with it
    examples: int
    complete: bool  # the last search passed: no failing cell left outside those found
    error: str | None = None  # why the map could not be finished (verify goes on with the others)
    stopped: str | None = None  # "budget": stopped when verify's --map-seconds was spent
    note: str | None = None  # why there is no failing cell although the property failed

    def merged(self) -> list[list[Cell]]:
        """Cells with the same trigger, together (two rounds can find one trigger twice)."""
        groups: dict[str, list[Cell]] = {}
        for cell in self.cells:
            groups.setdefault(cell.title(), []).append(cell)
        return list(groups.values())

    def lines(self) -> list[str]:
        if self.error is not None:
            return [f"{self.property}: no map: {self.error.splitlines()[0][:300]}"]
        groups = self.merged()
        out = [f"{self.property}: {len(groups)} failing cell(s), {self.examples} examples"
               + ("" if self.complete else f" (stopped at {STOPPED_AT.get(self.stopped, 'the round limit')}; "
                                        "more cells may fail)")]
        if not groups and self.note:
            out.append(f"  no failing cell: {self.note}")
        for group in groups:
            cell = group[0]
            kinds = ", ".join(dict.fromkeys(c.kind for c in group))
            if cell.diagnosis is None:
                out.append(f"  fails   {describe(cell.features)}: {kinds}")
            else:
                diagnosis = diagnosing.Diagnosis.from_dict(cell.diagnosis)
                out.append(f"  fails   {diagnosis.describe()}: {kinds}; {diagnosis.rate_text()}"
                           + SOURCE_NOTES.get(cell.source, "").format(found_by=cell.found_by)
                           + cut_short_note(diagnosis.cut_short))
                out += diagnosis.lines()
                if diagnosis.pair and diagnosis.pair.get("file"):
                    pair = diagnosis.pair
                    out.append(f"          pair one field apart: {pair['field']} {pair['failing']} fails, "
                               f"{pair['field']} {pair['passing']} passes; the failing one:")
                    out.append(f"          replay: {recording.replay_command(pathlib.Path(pair['file']))}")
                axes = " | ".join(dict.fromkeys(describe(c.features) if c.features or not diagnosis.cut_short
                                                else "none shown" for c in group))
                out.append(f"          feature axes: {axes}")
            out += [f"          {'worst:' if not index else '      '} {line[:300]}"
                    for index, line in enumerate(failure_text.worst_lines(cell.error))]
            for c in group:
                out.append(f"          replay: {recording.replay_command(pathlib.Path(c.file))}")
        failing_values = {(axis, value) for cell in self.cells for axis, value in cell.features.items()}
        for axis, counts in self.passing.items():
            shown = ", ".join(f"{value}{' (also in a failing cell)' if (axis, value) in failing_values else ''}: "
                              f"{count}" for value, count in counts.items())
            out.append(f"  passes  {axis}: {shown}")
        return out


def matches(cell: dict[str, str], found: dict[str, str]) -> bool:
    return all(found.get(axis) == value for axis, value in cell.items())


def search(prop, strategy, run_example: Callable, exclude: list[dict], max_examples: int, shrink: bool = True,
           conditions: tuple = ()):
    """Run ``prop`` over ``strategy`` (cases inside any ``exclude`` cell rejected). Returns
    ``(failing case or None, its error, features of the passing examples)``; the failing case is
    hypothesis' shrunk one."""
    passed: list[dict] = []
    last: dict = {}
    phases = profiles.CI_PHASES if shrink else profiles.NO_SHRINK_PHASES

    @settings(profiles.ci_settings(max_examples=max_examples, phases=phases, report_multiple_bugs=False,
                                   verbosity=Verbosity.quiet, database=None,
                                   suppress_health_check=list(HealthCheck)))
    @given(case=strategy)
    def explore(case):
        found = features(_base(case), prop.rotates)
        if any(matches(cell, found) for cell in exclude) or any(diagnosing.inside(c, case) for c in conditions):
            reject()
        try:
            run_example(case)
        except FAILURES as error:
            last["case"], last["error"] = case, error
            raise
        passed.append(found)

    try:
        explore()
    except OutOfTime:  # the map's time budget, with a failing case found: shrunk as far as it got (cut_short.py)
        if "case" in last:
            raise cut_short.CutShort(last["case"], last["error"], "shrinking", passed=passed) from None
        raise
    except FAILURES as error:
        return last.get("case"), error, passed
    except FlakyFailure:
        # the same case failed one way, then another (a wrong result, then a crash): a kernel whose
        # out-of-bounds writes corrupt its process does that. The last failure is the finding.
        last["error"].flaky = True
        return last.get("case"), last["error"], passed
    except Unsatisfiable:
        pass
    return None, None, passed


def failing_cell(prop, impl, run_example: Callable, case, cell: dict[str, str] | None = None) -> dict[str, str]:
    """The feature values of ``case`` its failure needs (see the module docstring, step 2), added to
    ``cell`` (a new dict by default) as each is shown (what a cut-short cell keeps)."""
    base = _base(case)
    found = features(base, prop.rotates)
    cell = {} if cell is None else cell
    for axis in axes_of(base, prop.rotates):
        value = found.get(axis.name)
        if value is None:
            continue
        for other in axis.values:
            moved = axis.set(base, other) if other != value else None
            if holds.passes_every_seed(prop, impl, run_example, moved):
                cell[axis.name] = value
                break
    return cell


def _cell(prop, impl, device, run_example: Callable, strategy, case, error, source: str = "shrunk",
          on_step: Callable[[str], None] = lambda text: None) -> Cell:
    """A failing cell of ``case``: its feature-axis cell, its diagnosis in its own fields with the
    failure rate inside it, and its replay file (``on_step``: told each step as it starts). The map's
    time budget spent on the way (``OutOfTime``) raises ``cut_short.CutShort`` with what was shown."""
    cell, diagnosis, step, before = {}, None, "feature values", None
    try:
        on_step(f"{recording.failure_kind(error)}, finding its feature values")
        failing_cell(prop, impl, run_example, case, cell)
        on_step(f"{describe(cell)}, finding its trigger")
        step = "trigger"
        diagnosis = diagnosing.diagnose(prop, impl, run_example, case)
        on_step(f"{diagnosis.describe()}, measuring its failure rate")
        step = "rate"
        refinement.measure_and_refine(prop, impl, strategy, run_example, diagnosis, case)
        on_step(f"{diagnosis.describe()} (fails {'/'.join(map(str, diagnosis.rate or [0, 0]))})")
        step = "pair"
        if diagnosis.pair:
            diagnosis.pair["file"] = _pair_file(prop, impl, device, run_example, diagnosis.pair)
        diagnosis.admits = admitted(prop, impl, case, diagnosis.condition, cell)
        on_step(f"{diagnosis.describe()}, running it at each value it admits")
        step, before = "holds", cut_short.snapshot(diagnosis)
        holds.exclude_passing_values(prop, impl, strategy, run_example, diagnosis, case, cell)
    except OutOfTime:
        step = "necessity" if step == "rate" and diagnosis.necessity is not None else step
        raise cut_short.CutShort(case, error, step, cell, before or diagnosis, source=source) from None
    return _saved_cell(prop, _failure(prop, impl, device, case, error, cell, diagnosis.describe()),
                       dataclasses.asdict(diagnosis), source)


def _failure(prop, impl, device, case, error, cell: dict[str, str], trigger: str) -> dict:
    """The failure record of a cell's failing case (``cell``: its feature values; ``trigger``: its condition)."""
    failure = dict(recording.failure_record(prop, impl, device, case, error), cell=cell, trigger=trigger)
    if getattr(error, "flaky", False):
        failure["kind"] += ", not the same on replay"
    return failure


def _cut_cell(prop, impl, device, stop: cut_short.CutShort) -> Cell:
    """The cell being derived when the map's time budget ran out, with what was shown by then
    (``cut_short.py``); it admits the failing case's own feature values only (the heat map's squares)."""
    found = cut_short.diagnosis(stop)
    found.admits = {axis: [value] for axis, value in features(_base(stop.case), prop.rotates).items()}
    failure = dict(_failure(prop, impl, device, stop.case, stop.error, stop.needed, found.describe()),
                   cut_short=found.cut_short)
    return _saved_cell(prop, failure, dataclasses.asdict(found), stop.source)


def _saved_cell(prop, failure: dict, diagnosis: dict | None, source: str) -> Cell:
    """``failure`` (a failure record with its ``cell``) saved for replay, and the Cell pointing to its file."""
    path = recording.save_failure(failure, f"map:{prop.name}", profiles.full_name("ci"))
    return Cell(failure["cell"], failure["kind"], failure_text.excerpt(failure["error"]), str(path), diagnosis, source,
                failure.get("worst"))


def _pair_file(prop, impl, device, run_example: Callable, pair: dict) -> str | None:
    """The replay file of the failing example of a cell's pair one field apart (run again for its error)."""
    case = case_types.from_jsonable(pair["case"])
    try:
        run_example(case)
    except FAILURES as error:
        failure = dict(recording.failure_record(prop, impl, device, case, error),
                       pair=f"{pair['field']} {pair['passing']} passes, the rest of the case the same")
        return str(recording.save_failure(failure, f"map:{prop.name}", profiles.full_name("ci")))
    except (UnsatisfiedAssumption, ChildNotProvided):
        pass
    return None


def map_property(prop, impl, device, run_example: Callable, max_examples: int, rounds: int = 6,
                 known: tuple = (), baseline: tuple[dict, ...] | list[dict] = (),
                 on_step: Callable[[str], None] = lambda text: None,
                 out_of_time: Callable[[], bool] = lambda: False, found: tuple[dict, ...] | list[dict] = ()
                 ) -> PropertyMap:
    """The conformance map of ``prop`` on ``impl`` (module docstring). ``known``: the cases the
    property's test failed with, diagnosed when the map's own searches meet no failure;
    ``baseline``: a baseline report's cells of ``prop``, sorted out first (``known_cells.py``);
    ``found``: the cells this run's maps of other properties found (report.json entries with
    ``found_by``), sorted out the same way and, where one is confirmed here, carried with the rate
    measured here instead of derived again (one defect, one map);
    ``on_step``: told each step (``round 2/6, cell 3: CONDITION (fails 4/4)``) as it starts;
    ``out_of_time``: asked before each round after the first; true stops the map there. A
    ``running.executor.OutOfTime`` from ``run_example`` stops it where it is, the cells complete so
    far kept, and the one being shrunk or diagnosed kept as far as it got (``cut_short.py``)."""
    entries = [*baseline, *(entry for entry in found if known_cells.applies(entry, prop))]
    sorter = known_cells.Sorter(run_example, prop.rotates, entries)
    run_example = sorter if entries else run_example
    cells: list[Cell] = []
    cases: list = []  # the failing case of each of ``cells`` found by a round
    exclude: list[dict] = []
    passing: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    examples, complete, stopped, carried, note = 0, False, None, [], None
    strategy = prop.strategy_for(impl)
    try:
        sorter.confirm_found(known)
        for number in range(1, rounds + 1):
            if number > 1 and out_of_time():
                stopped = "budget"
                break
            on_step(f"round {number}/{rounds}, searching")
            case, error, passed = search(prop, strategy, run_example, exclude, max_examples,
                                         conditions=tuple(c.diagnosis["condition"] for c in cells if c.diagnosis))
            examples += len(passed) + (case is not None)
            _count(passing, passed)
            if case is None:
                complete = True
                break
            head = f"round {number}/{rounds}, cell {len(cells) + 1}"
            cells.append(_cell(prop, impl, device, known_cells.outside_cells(run_example, cells), strategy, case, error,
                               on_step=lambda text, head=head: on_step(f"{head}: {text}")))
            cases.append(case)
            exclude.append(cells[-1].features)
            if not cells[-1].features:  # every case tried fails: nothing left to map
                complete = True
                break
        holds.join_split_cells(prop, impl, strategy, run_example, cells, cases, on_step)
        for confirmed in sorter.confirm(known) if entries else []:
            carried.append(_carried(prop, impl, device, confirmed, strategy, sorter.run_example, on_step))
        if any(cell.diagnosis and cell.diagnosis.get("cut_short") for cell in carried):
            stopped, complete = "budget", False
        if not cells and not carried:
            outside = tuple(case for case in known if not sorter.inside(case))
            note = _known_failures(prop, impl, device, run_example, strategy, outside, cells, examples)
    except OutOfTime as stop:  # verify's --map-seconds spent during a round: the cells complete so far are kept
        stopped, complete = "budget", False
        if isinstance(stop, cut_short.CutShort):  # and the one being derived, as far as it got
            cells.append(_cut_cell(prop, impl, device, stop))
            examples += len(stop.passed) + (stop.step == "shrinking")
            _count(passing, stop.passed)
    order = {name: index for index, name in enumerate(AXIS)}
    ordered = {axis: dict(sorted(counts.items(), key=lambda item: AXIS[axis].values.index(item[0])))
               for axis, counts in sorted(passing.items(), key=lambda item: order.get(item[0], 99))}
    return PropertyMap(prop.name, prop.operations, [*carried, *cells], ordered, examples, complete,
                       note=note or None, stopped=stopped)


def _count(passing: dict[str, collections.Counter], passed: list[dict]) -> None:
    """Add the feature values of a search's passing examples to ``passing`` (axis -> value -> examples)."""
    for seen in passed:
        for axis, value in seen.items():
            passing[axis][value] += 1


def _carried(prop, impl, device, known: known_cells.KnownCell, strategy, run_example: Callable,
             on_step: Callable[[str], None]) -> Cell:
    """A known cell this run fails in: its condition (so its id), this run's failing example as its
    replay file. A baseline's cell keeps the baseline's rate; a cell found for another property of
    this run gets its failure rate measured in this property (``diagnosis.measure``)."""
    entry = known.entry
    failure = dict(recording.failure_record(prop, impl, device, known.case, known.error),
                   cell=entry["condition"].get("features") or {}, trigger=entry["condition"]["text"])
    diagnosis = known_cells.diagnosis_of(entry)
    if entry.get("found_by") is None:
        return _saved_cell(prop, failure, diagnosis, known_cells.SOURCE)
    if diagnosis is not None:
        on_step(f"{entry['condition']['text']}: found for {entry['found_by']}, measuring its failure rate here")
        try:
            diagnosis["rate"], diagnosis["pair"] = diagnosing.measure(prop, impl, strategy, run_example,
                                                                      diagnosis["condition"], known.case,
                                                                      diagnosing.CARRIED_RATE_EXAMPLES)
        except OutOfTime:  # the map's budget spent while measuring: kept, its rate not measured (cut_short.py)
            diagnosis["rate"] = None
            diagnosis["cut_short"] = failure["cut_short"] = cut_short.STEPS["rate"]
        diagnosis["pair"] = None  # the pair walk's file belongs to the property that found the cell
        diagnosis["admits"] = admitted(prop, impl, known.case, diagnosis["condition"], failure["cell"])
    cell = _saved_cell(prop, failure, diagnosis, known_cells.CARRIED)
    cell.found_by = entry["found_by"]
    return cell


def _known_failures(prop, impl, device, run_example, strategy, known, cells, examples) -> str:
    """Diagnose the test run's failing cases the map's searches did not meet (appended to
    ``cells``); else say why the map has no cell."""
    reran, outside = 0, {}
    for case in known:
        if not prop.allows(impl, case):  # a served deployment's case (test_deployments.py), run as it is
            for operation in prop.operations:
                outside.update(impl.caps(operation).violations(_base(case), prop.rotates))
            continue
        reran += 1
        try:
            run_example(case)
        except FAILURES as error:
            cells.append(_cell(prop, impl, device, run_example, strategy, case, error, source="test run"))
            return ""
        except (UnsatisfiedAssumption, ChildNotProvided):
            continue
    if reran:
        return (f"the map's search met no failure in {examples} examples, and the test run's failing "
                f"example{'s' if reran > 1 else ''} ({reran}) passed when run again: a failure that depends on "
                "more than the case (the process's state, timing, an earlier example's writes)")
    if outside:
        return (f"the map's search met no failure in {examples} examples; the test run's failing examples lie "
                f"outside the declared limits ({', '.join(f'{axis} {value}' for axis, value in outside.items())}): "
                "deployments of an engine layout the implementation serves, run as the engine calls them, which "
                "the map does not move (see the failures above and the deployments' verdicts)")
    return (f"the map's search met no failure in {examples} examples and the test run left no failing "
            "example to rerun (see the failures above)")
