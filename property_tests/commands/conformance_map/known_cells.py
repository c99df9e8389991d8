"""A baseline's failing cells, sorted out of a conformance map before it is drawn (``verify --baseline``).

Without a baseline, the map of a property draws its cells from every failure it meets. With one,
the new run's failures of a property the baseline already fails would be mapped together with the
known ones, and the known cells would come out described differently (a condition text that
covers both), so every id would look new. Instead, each example the map runs is first sorted by
the baseline's cells of that property (``cells[]`` of the baseline report). A case is inside a
known cell where the baseline's map left it out of its searches once it had found the cell
(``conformance_map.search``): the case has the cell's feature values (``condition.features``), or
the cell's condition (``condition.data``) holds for it (``diagnosis.inside``). Then:

- an example inside a known cell that fails the way the cell failed (``kind_family``:
  a wrong result and a crash are one) is the known failure: the first one confirms the cell
  (with this run's failure file), and to the map it is a rejected case (``UnsatisfiedAssumption``:
  hypothesis draws another, the diagnosis does not count it, a failure rate leaves it out);
- every other example counts as it does without a baseline: one outside every known cell, one
  inside that passes, and one inside that fails another way (a new failure in a known cell).

A cell found for another property of the same run (``found_by``: one defect, one map) is sorted
the same way, and first confirmed with the property test's failing cases inside it
(``Sorter.confirm_found``); once confirmed, the examples inside it are left out unrun (rejected
before the kernel runs), as the map's own cells are once found.

So the map's searches, shrinking, diagnosis and rates see only what the baseline does not
explain: a new bug is mapped from its own failures and gets its own id, and a confirmed known
cell keeps the baseline's id and condition. A known cell no example of the map confirmed is tried
with the property test's failing examples inside it, then with the baseline's own failing example
(its failure file, where that still exists); one that none of them fails in is not carried, and
its id is listed as now passing.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Callable

from hypothesis.errors import UnsatisfiedAssumption

from mla_fuse_conformance.cases import fields as case_fields
from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.cases.features import features
from mla_fuse_conformance.commands.conformance_map import diagnosis as diagnosing
from mla_fuse_conformance.commands.conformance_map.identity import kind_family
from mla_fuse_conformance.running import recording
from mla_fuse_conformance.running.executor import ChildNotProvided

SOURCE = "baseline"  # ``Cell.source`` of a carried known cell
CARRIED = "another property"  # ``Cell.source`` of a cell found for another property of the same run


def applies(entry: dict, prop) -> bool:
    """Whether a cell found for another property can be tried as the same cell in ``prop`` (any
    property but the one that found it). The condition itself is
    tried on ``prop``'s cases by ``KnownCell.holds``: a feature value or a field ``prop``'s cases do
    not have is never met there, so such a cell is never confirmed in ``prop``."""
    return entry.get("found_by") not in (None, prop.name)


@dataclasses.dataclass
class KnownCell:
    """A baseline report's cell (``entry``) and this run's failing example inside it, once found."""

    entry: dict
    case: object = None
    error: BaseException | None = None

    def holds(self, case, rotates: bool, relations: Callable[[], dict | None]) -> bool:
        """Whether ``case`` lies inside the cell as the map that found it left it out of its later
        searches (``conformance_map.search``): it has the cell's feature values, or its condition
        holds (``relations``: the case's, computed once on demand). A cell found for another property
        holds by its trigger alone: its condition where it has one, else its feature values, never
        for a cell of neither (that property failed everywhere: this one maps itself)."""
        condition, data = self.entry["condition"], self.entry["condition"].get("data")
        needed = condition.get("features") or {}
        base = diagnosing._base(case)
        found = features(base, rotates)
        has_values = all(found.get(axis) == value for axis, value in needed.items())
        if self.entry.get("found_by") is not None:
            if not data:
                return bool(needed) and has_values
            fields = case_fields.leaves(base)
            named = all(name in fields for kind, name, _ in data if kind in ("field", "field-not"))
            return named and self._inside(data, case, relations)  # a field this case lacks: never inside
        return has_values or (data is not None and self._inside(data, case, relations))

    @staticmethod
    def _inside(data: list, case, relations: Callable[[], dict | None]) -> bool:
        needs_relations = any(kind == "relation" for kind, _, _ in data)
        return diagnosing.inside(data, case, (relations() or {}) if needs_relations else {})

    def explains(self, error: BaseException) -> bool:
        return kind_family(recording.failure_kind(error)) == kind_family(self.entry["kind"])


class Sorter:
    """``run_example`` of a map with a baseline: runs every example and rejects the known failures."""

    def __init__(self, run_example: Callable, rotates: bool, entries: list[dict]) -> None:
        self.run_example, self.rotates = run_example, rotates
        self.known = [KnownCell(entry) for entry in entries]
        self.left_out: list[KnownCell] = []  # cells of other properties confirmed before the search

    def confirm_found(self, tried: tuple) -> None:
        """Confirm each cell found for another property with the property test's failing cases inside
        it (``tried``; the first that fails the cell's way confirms it). A confirmed cell's cases are
        then left out of the map unrun, as the map's own cells are once found: one defect is confirmed
        with a few cases, not run again in every property it breaks."""
        for known in self.known:
            if known.entry.get("found_by") is not None:
                self._confirm_with(known, tried)
        self.left_out = [known for known in self.known if known.entry.get("found_by") is not None and known.case]

    def inside(self, case) -> list[KnownCell]:
        cached: list = []

        def relations():
            if not cached:
                cached.append(diagnosing.relations_of(case))
            return cached[0]

        return [known for known in self.known if known.holds(case, self.rotates, relations)]

    def __call__(self, case, *args):
        cells = self.inside(case) if self.known else []
        confirmed = [known for known in cells if known in self.left_out]
        if confirmed:
            raise UnsatisfiedAssumption(f"inside {confirmed[0].entry['id']}, confirmed for another property: not run")
        try:
            return self.run_example(case, *args)
        except diagnosing.FAILURES as error:
            explained = [known for known in cells if known.explains(error)]
            if not explained:
                raise
            for known in explained:
                if known.case is None:
                    known.case, known.error = case, error
            raise UnsatisfiedAssumption(f"a known failure: {explained[0].entry['id']}") from None

    def confirm(self, tried: tuple) -> list[KnownCell]:
        """The known cells with a failing example: the map's, else one of ``tried`` (the property
        test's failing cases) or the baseline's own failing case inside the cell."""
        for known in self.known:
            own = baseline_case(known.entry) if known.entry.get("found_by") is None else []  # not another property's
            self._confirm_with(known, [*tried, *own])
        return [known for known in self.known if known.case is not None]

    def _confirm_with(self, known: KnownCell, cases) -> None:
        """Rerun the ``cases`` inside ``known``, in turn, until one confirms it."""
        for case in cases:
            if known.case is not None:
                return
            if known.holds(case, self.rotates, lambda case=case: diagnosing.relations_of(case)):
                self.rerun(known, case)

    def rerun(self, known: KnownCell, case) -> None:
        try:
            self.run_example(case)
        except diagnosing.FAILURES as error:
            if known.explains(error):
                known.case, known.error = case, error
        except (UnsatisfiedAssumption, ChildNotProvided):
            pass


def baseline_case(entry: dict) -> list:
    """The case of the baseline cell's failure file, or nothing where the file is gone or unreadable."""
    path = (entry.get("replay") or {}).get("file")
    try:
        return [case_types.from_jsonable(json.loads(pathlib.Path(path).read_text())["case"])] if path else []
    except (OSError, ValueError, KeyError, TypeError):
        return []


def diagnosis_of(entry: dict) -> dict | None:
    """The baseline cell's diagnosis as ``conformance_map.Cell`` keeps one (None: a cell of feature values)."""
    if entry["condition"].get("data") is None:
        return None
    return {"fields": entry.get("fields") or [], "relations": entry.get("relations") or {},
            "condition": entry["condition"]["data"], "tried": 0, "dropped": 0, "rate": entry.get("rate"),
            "pair": entry.get("pair"), "refined_from": None,
            "necessity": entry.get("necessity"), "admits": entry.get("admits")}


def outside_cells(run_example: Callable, cells: list) -> Callable:
    """``run_example`` for deriving the next cell: a case inside a cell found before fails by that cell's
    defect, so there it does not apply (``diagnosis.outcome``: None), as the search rejects it; the new
    cell's trigger, rate and necessity are shown on the other cases (a short ``slot_mapping``'s crash,
    drawn while a rare fp8 rounding defect's conjuncts are checked, made a needed one look dropped)."""
    conditions = tuple(cell.diagnosis["condition"] for cell in cells if cell.diagnosis and cell.diagnosis["condition"])
    if not conditions:
        return run_example

    def run(case, *args):
        if any(diagnosing.inside(condition, case) for condition in conditions):
            raise UnsatisfiedAssumption("inside a cell found before")
        return run_example(case, *args)
    return run
