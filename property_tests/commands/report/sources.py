"""What the report views (``html.py``, ``markdown.py``) are made from: a report
directory's ``report.json`` (docs/REPORT.md), with schema 1 converted where it can be,
``comparison.json`` (``mla-fuse compare``) and ``outcomes.jsonl`` (examples per operation and
feature value).

A schema-1 report (what earlier versions of ``verify`` wrote) becomes a schema-2 dict: its fields
moved to their schema-2 places, its maps' cells flattened into ``cells`` with their ids (the same
code as ``verify``'s, ``document.cells``), and ``missing`` naming what schema 1 does not hold
(the environment, coverage, deployments), which the views show as a note instead of a section.
"""

from __future__ import annotations

import collections
import json
import pathlib

from mla_fuse_conformance.commands.report import document
from mla_fuse_conformance.commands.report.defects import defects
from mla_fuse_conformance.commands.report.document import REPORT_FILE
from mla_fuse_conformance.running.recording import OUTCOMES_FILE

COMPARISON_FILE = "comparison.json"
SCHEMA1_MISSING = ("environment", "coverage", "deployments")


def read_json(path: pathlib.Path) -> dict | None:
    """``path``'s JSON object, or None where there is no such file."""
    if not path.exists():
        return None
    found = json.loads(path.read_text())
    if not isinstance(found, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(found).__name__}")
    return found


def load(report_dir: pathlib.Path) -> dict | None:
    """``report_dir``'s report.json as schema 2 (schema 1 converted), or None where there is none."""
    found = read_json(pathlib.Path(report_dir) / REPORT_FILE)
    if found is not None and found.get("schema", 1) < 2:
        found = from_schema1(found)
    if found is not None and "defects" not in found:  # written before defects were counted
        found["defects"] = defects(found.get("cells") or [])
    return found


def comparison(report_dir: pathlib.Path) -> dict | None:
    return read_json(pathlib.Path(report_dir) / COMPARISON_FILE)


def from_schema1(old: dict) -> dict:
    """A schema-1 report's fields in their schema-2 places (docs/REPORT.md, "From schema 1")."""
    passed = bool(old.get("passed"))
    return {"schema": 1, "missing": list(SCHEMA1_MISSING),
            "run": {"profile": old.get("profile"), "seconds": old.get("seconds"),
                    "pytest_exit_code": old.get("pytest_exit_code"), "exit_code": 0 if passed else 1},
            "implementation": {"spec": old.get("implementation"), "name": old.get("name"), "version": None,
                               "declaration": {"lines": old.get("declarations") or []}},
            "verdict": "PASS" if passed else "FAIL", "operations": old.get("operations") or {},
            "cells": schema1_cells(old.get("maps") or []), "failures": old.get("failures") or [],
            "limits": old.get("limits") or [], "maps": old.get("maps") or [], "baseline": None}


def schema1_cells(maps: list[dict]) -> list[dict]:
    """``maps[].cells[]`` flattened as ``verify`` flattens them; a cell whose diagnosis this version
    cannot read is kept with its feature values as its condition."""
    # the suite's modules (property_map loads the harness): imported where a schema-1 report is read
    from mla_fuse_conformance.commands.conformance_map.property_map import Cell, PropertyMap

    found = []
    for entry in maps:
        for cell in entry.get("cells") or []:
            known = Cell(cell.get("features") or {}, cell.get("kind") or "", cell.get("error") or "",
                         cell.get("file") or "", cell.get("diagnosis"), cell.get("source") or "shrunk",
                         cell.get("worst"))
            one = PropertyMap(entry.get("property", "?"), tuple(entry.get("operations") or ()), [known], {}, 0, True)
            try:
                found += document.cells([one])
            except (KeyError, TypeError, ValueError):
                one.cells[0].diagnosis = None
                found += document.cells([one])
    return found


def examples_per_operation(report_dir: pathlib.Path, spec: str | None) -> dict[str, dict[str, dict[str, int]]]:
    """``{operation: {axis: {value: examples}}}`` from ``outcomes.jsonl``'s per-test metrics (what
    ``coverage.axes`` sums over every operation); empty where the file is not there."""
    path = pathlib.Path(report_dir) / OUTCOMES_FILE
    counts: dict = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    if not path.exists():
        return {}
    for line in path.read_text().splitlines():
        metrics = (json.loads(line).get("metrics") or {}) if line.strip() else {}
        if metrics.get("impl") != spec:
            continue
        for operation in metrics.get("operations") or ():
            for axis, values in (metrics.get("axes") or {}).items():
                counts[operation][axis].update(values)
    return {operation: {axis: dict(values) for axis, values in axes.items()} for operation, axes in counts.items()}
