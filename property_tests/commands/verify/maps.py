"""``verify``'s map phase: the conformance map of each failing property, then the declared limits.

The searching properties are mapped before those of fixed examples, each group the most failing
tests first. ``--map-rounds`` bounds each map (its
failing cells), ``--map-seconds`` the whole phase: no map starts once the budget is spent, a map
running then stops where it is (the example running killed: ``Executor.run``'s ``budget``), and
the limit checks stop. A SIGTERM or SIGINT (``stopping.py``)
stops the phase where it is. Whatever was not mapped is listed as not mapped (``MapPhase.as_json``:
report.json's ``run.map``; ``lines``: the console), never dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import sys
import time
from typing import Callable

from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.commands import progress
from mla_fuse_conformance.commands.conformance_map.cli import MAP_SECONDS
from mla_fuse_conformance.commands.report import document
from mla_fuse_conformance.commands.report.cells import map_text
from mla_fuse_conformance.declarations.property_modules import EXPLICIT_ONLY_MODULES
from mla_fuse_conformance.running.devices import select_device
from mla_fuse_conformance.settings import profiles

# The suite's own modules (running/harness.py and running/executor.py, conformance_map/property_map.py and limits.py,
# which load the property modules, their strategies and the executor's child) are imported inside the functions
# that use them, here and in verify/summary.py and report/document.py: verify imports this module before
# devices.triton_kernels_for_the_run() and before the adapter, and the suite's modules load after both, when the
# properties' outcomes are read and the map runs, as they always have.

DEFAULT_SECONDS = MAP_SECONDS  # --map-seconds: ten minutes, so the properties and the map fit a CI job of an hour


def property_of_test_id(nodeid: str, properties: dict):
    """The kernel property (of ``properties``, ``harness.all_properties()``) a test id runs, or None."""
    path, _, function = nodeid.partition("::")
    return properties.get(f"{pathlib.PurePath(path).stem}:{function.partition('[')[0]}")


def failing_properties(outcomes: list[dict]) -> list[str]:
    """Names of the properties that failed: those with a failure file, then registered properties
    whose test failed without one (a worker that died after its example had finished, e.g. at a
    ``free`` of a heap its kernel had corrupted). Bad-input properties are per corruption already."""
    from mla_fuse_conformance.running.harness import all_properties

    properties = all_properties()
    names = []
    for line in outcomes:
        failure = line.get("failure")
        if failure and failure["property"] not in names:
            names.append(failure["property"])
    for line in outcomes:
        failed_without_file = line["outcome"] == "failed" and not line.get("failure")
        prop = property_of_test_id(line["nodeid"], properties) if failed_without_file else None
        if prop is not None and not prop.needs_input_checks and prop.name not in names:
            names.append(prop.name)
    return names


def to_map(outcomes: list[dict]) -> list[str]:
    """The failing properties a map is made for (not the bad-input ones): those that search (random
    cases) before those of fixed examples (deployments, real sizes, interactions: one test per example,
    so many failing tests, and large cases that are slow to map), each group the most failing tests
    first (ties in the order they failed). A fixed-example property then mostly confirms the cells
    the searching maps found (one defect, one map) instead of deriving them from its few cases."""
    from mla_fuse_conformance.running.harness import all_properties, property_named

    properties, failing = all_properties(), collections.Counter()
    for line in outcomes:
        if line["outcome"] == "failed":
            prop = ((line.get("failure") or {}).get("property")
                    or getattr(property_of_test_id(line["nodeid"], properties), "name", None))
            failing[prop] += 1
    names = [name for name in failing_properties(outcomes) if not property_named(name).needs_input_checks]
    return sorted(names, key=lambda name: (name.partition(":")[0] in EXPLICIT_ONLY_MODULES, -failing[name]))


@dataclasses.dataclass
class MapPhase:
    """What the map phase was asked for and how far it got."""

    properties: list[str]  # to map, in order
    rounds: int
    seconds: float
    limits_declared: bool = True  # the implementation declares limits to check
    maps: list = dataclasses.field(default_factory=list)
    limits: list = dataclasses.field(default_factory=list)
    stopped: str | None = None  # a key of report/cells.py's STOPPED_BY
    running: bool = True
    limits_checked: bool = False

    def __post_init__(self) -> None:
        self.limits_checked = not self.limits_declared  # none to check
        if not self.rounds or not self.seconds:
            self.stopped, self.running = "off", False

    def not_mapped(self) -> list[str]:
        mapped = {found.property for found in self.maps}
        return [name for name in self.properties if name not in mapped]

    def as_json(self) -> dict:
        """report.json's ``run.map`` (docs/REPORT.md)."""
        return {"properties": len(self.properties), "mapped": len(self.properties) - len(self.not_mapped()),
                "not_mapped": self.not_mapped(), "stopped": self.stopped, "running": self.running,
                "limits_checked": self.limits_checked, "rounds": self.rounds, "seconds": self.seconds}


def lines(phase: dict) -> list[str]:
    """The console's account of a map phase that left failing properties unmapped (``phase``: ``run.map``)."""
    found = map_text(phase)
    return [f"conformance map: {found}"] if found else []


def run_maps(impl, outcomes: list[dict], profile: str, phase: MapPhase, phases: dict,
             known_cells: tuple[dict, ...] = (), on_map: Callable[[], None] = lambda: None,
             clock: Callable[[], float] = time.monotonic, check: Callable[[], None] | None = None) -> None:
    """Map ``phase.properties`` into ``phase.maps`` (``known_cells``: a baseline's, sorted out first;
    ``on_map``: called after each map), then check the declared limits into ``phase.limits``; their
    seconds added to ``phases`` as ``map`` and ``limits``. ``check``: the executor's (a signal's
    ``stopping.Stopped``, raised before an example or while one runs); it goes through, the
    executor's child killed, what was done kept in ``phase``."""
    from mla_fuse_conformance.running.executor import Executor

    max_examples = {"ci": profiles.CI_MAX_EXAMPLES, "dev": 30}.get(profile, 100)
    device, started = str(select_device()), clock()
    deadline = started + phase.seconds
    shown = progress.Progress(lambda text: print(text, end="", flush=True), sys.stdout.isatty())
    with Executor(impl.spec, device, impl.required, check=check) as executor:
        try:
            for name in phase.properties:
                if clock() >= deadline:
                    phase.stopped = "budget"
                    break
                phase.maps.append(map_one(name, impl, device, executor, outcomes, max_examples, phase.rounds,
                                          known_cells, shown, deadline, clock, found_before(phase.maps)))
                phases["map"] = round(clock() - started, 1)
                on_map()
            phases["map"], started = round(clock() - started, 1), clock()
            if phase.stopped is None:
                check_limits(impl, executor, phase, shown, deadline, clock, phases)
        except BaseException:
            executor.kill()  # a stopped map leaves no example running
            raise
    phase.running = False
    if phase.limits:
        phases.setdefault("limits", 0.0)
        shown.phase(f"mla-fuse verify: {len(phase.limits)} declared limits checked in {phases['limits']} s")


def found_before(maps: list) -> list[dict]:
    """The cells the maps so far derived themselves (not carried), as report.json entries with
    ``found_by``: each next map sorts them out first and carries those it confirms (one defect,
    one map: docs/REPORT.md); not a cell whose diagnosis was cut short."""
    return [dict(entry, found_by=entry["property"]) for entry in document.cells(maps)
            if entry["source"] in ("shrunk", "test run") and not entry.get("cut_short")]


def map_one(name, impl, device, executor, outcomes, max_examples, rounds, known_cells, shown, deadline, clock,
            found: list[dict] = ()):
    """The map of the property ``name`` (one that could not be finished: its error); ``found``: the
    cells earlier maps of this run derived."""
    from mla_fuse_conformance.commands.conformance_map.property_map import PropertyMap, map_property
    from mla_fuse_conformance.running.harness import property_named

    prop = property_named(name)
    shown.phase(f"mla-fuse verify: mapping {name} ...")
    run = progress.Counted(lambda case, p=prop: executor.run(p.name, case, budget=deadline - clock()), shown,
                           f"mapping {name}")
    try:
        known = tuple(case_types.from_jsonable(line["failure"]["case"]) for line in outcomes
                      if (line.get("failure") or {}).get("property") == name and line["failure"].get("case"))
        found = map_property(prop, impl, device, run, max_examples, rounds, known=known, on_step=run.step,
                             baseline=[cell for cell in known_cells if cell["property"] == name],
                             out_of_time=lambda: clock() >= deadline, found=found)
        shown.phase(f"{run.line()}: {len(found.cells)} failing cells")
        return found
    except Exception as error:  # noqa: BLE001 - one property's map must not cost the report
        shown.phase(f"mla-fuse verify: the map of {name} could not be finished: {type(error).__name__}: "
                    f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}")
        return PropertyMap(prop.name, prop.operations, [], {}, 0, False, error=f"{type(error).__name__}: {error}"[:2000])


def declared_limits(impl) -> list[tuple]:
    """``(operation, property, axis, value)`` per declared limit ``check_limits`` checks."""
    from mla_fuse_conformance.running.harness import all_properties

    found = []
    for op in impl.operations:
        prop = next((p for p in all_properties().values() if p.operations == (op,) and not p.needs_input_checks), None)
        if prop is not None:
            found += [(op, prop, axis, value) for axis, values in impl.caps(op).restrictions(prop.rotates).items()
                      for value in values]
    return found


def check_limits(impl, executor, phase: MapPhase, shown, deadline: float, clock, phases: dict) -> None:
    """Each declared limit, checked with a few cases just outside it, until the budget is spent."""
    from mla_fuse_conformance.commands.conformance_map.limits import check_limit

    started, cells = clock(), found_before(phase.maps)  # the map is done: its cells are the same for every limit
    for op, prop, axis, value in declared_limits(impl):
        if clock() >= deadline:
            phase.stopped = "budget"
            return
        shown.update(f"mla-fuse verify: checking the declared limits: {len(phase.limits)} done, now {op} "
                     f"{axis} {value}, {progress.elapsed(clock() - started)}")
        phase.limits.append(check_limit(prop, impl, lambda case, p=prop: executor.run(p.name, case, False),
                                        op, axis, value, device=executor.device, cells=cells))
        phases["limits"] = round(clock() - started, 1)
    phase.limits_checked, phases["limits"] = True, round(clock() - started, 1)
