"""A cell whose diagnosis the map's time budget cut short (docs/REPORT.md "cells": ``cut_short``).

``verify --map-seconds`` spent while a failing case is being shrunk or its cell diagnosed stops
the map there (``running.executor.OutOfTime``). The failing case is not dropped: the cell is kept
with what was established before the budget ran out, and says where it was cut short:

* cut while hypothesis shrank the case (``STEPS["shrinking"]``): the case as far as it shrank, no
  condition (``no condition established``);
* while its feature values were found, or its trigger: the feature values shown needed so far
  (the case moved off them passed with every seed), as ``["axis", AXIS, [VALUE]]`` conjuncts;
* while its failure rate was measured, or its conjuncts checked (``necessity.check_conjuncts``):
  the diagnosis' condition, the rate where it was measured, the verdicts reached;
* while it ran at each value it admits (``holds.py``) or replayed its pair: the diagnosis as it was
  before that step, none of its exclusions.
* a cell carried from another property's map (``property_map._carried``), cut while its failure rate is
  measured here: its condition as that map found it, its rate not measured.

Every conjunct whose necessity was not checked gets the verdict ``NOT_CHECKED`` and reads ``(not
shown needed)``; a rate not measured reads as such; the cell admits the failing case's own feature
values only (the heat map colours nothing else for it); ``Diagnosis.cut_short`` names the step, and
every view says so (``identity.cut_short_note``). So it is for the cell of any round, and for a
test run's failing case the map diagnoses (``property_map._known_failures``).
"""

from __future__ import annotations

import dataclasses

from mla_fuse_conformance.commands.conformance_map.diagnosis import NOT_CHECKED, Diagnosis
from mla_fuse_conformance.running.executor import OutOfTime

STEPS = {"shrinking": "shrinking its failing case", "feature values": "finding its feature values",
         "trigger": "finding its trigger", "rate": "measuring its failure rate",
         "necessity": "checking that each conjunct is needed", "pair": "replaying its pair one field apart",
         "holds": "running it at each value it admits"}


class CutShort(OutOfTime):
    """The budget ran out while the cell of ``case`` (failed with ``error``) was being derived: what
    was established by then (module docstring): ``needed``, the feature values shown needed so far;
    ``diagnosis``, the diagnosis as the step left it; ``passed``, the feature values of the passing
    examples of the search that found it, when it was cut while shrinking; ``source``, the cell's."""

    def __init__(self, case, error: BaseException, step: str, needed: dict[str, str] | None = None,
                 diagnosis: Diagnosis | None = None, passed: list[dict] | None = None, source: str = "shrunk") -> None:
        super().__init__()
        self.case, self.error, self.step, self.diagnosis = case, error, step, diagnosis
        self.needed, self.passed, self.source = dict(needed or {}), list(passed or ()), source


def diagnosis(stop: CutShort) -> Diagnosis:
    """The cut-short cell's diagnosis: what ``stop`` established, each conjunct not checked marked so."""
    found = stop.diagnosis or Diagnosis(fields=[], relations={},
                                        condition=[["axis", name, [value]] for name, value in stop.needed.items()])
    checked = [entry["conjunct"] for entry in found.necessity or ()]
    found.necessity = [*(found.necessity or ()),
                       *({"conjunct": conjunct, "verdict": NOT_CHECKED} for conjunct in found.condition
                         if conjunct not in checked)]
    found.cut_short = STEPS[stop.step]
    return found


def snapshot(found: Diagnosis) -> Diagnosis:
    """A copy of ``found`` as it is (a step that changes it in place may be cut short half-way)."""
    return Diagnosis.from_dict(dataclasses.asdict(found))
