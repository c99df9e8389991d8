"""report.json, schema 2 (docs/REPORT.md): the parts made from a run's outcomes and maps.

``verify`` gathers the run (command, times, exit codes), the environment and the implementation
(``environment.py``) and the per-operation table; this module adds the parts read from
``outcomes.jsonl`` and the conformance maps: ``cells`` (the maps' failing cells, flattened, each
with a stable ``id``), ``failures`` with their replay commands, ``coverage`` (examples per feature
value and per rare event) and ``deployments`` (one verdict per named deployment).
"""

from __future__ import annotations

import collections
import functools
import dataclasses
import json
import pathlib
import re

from xml.etree import ElementTree

from mla_fuse_conformance.cases.features import AXES, axes_for
from mla_fuse_conformance.commands.conformance_map.identity import cell_id
from mla_fuse_conformance.commands.report.defects import defects
from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS
from mla_fuse_conformance.running import recording

SCHEMA = 2
REPORT_FILE = "report.json"
# events counted by the recorder's metrics, and events that are one feature value
COUNTED_EVENTS = {"fp8 saturation": "saturation_cases", "padded slot": "padded_slot_cases"}
VALUE_EVENTS = {"NaN input": ("NaN inputs", "yes"), "short slot_mapping": ("slot_mapping length", "< T"),
                "empty batch": ("tokens", "0")}
DEPLOYMENT_TEST = re.compile(r"::test_(?P<operation>\w+)_in_deployment\[(?P<name>.+)\]$")
UNSUPPORTED = "not supported (declared)"
INTERACTIONS_TEST = re.compile(r"test_interactions\.py::test_\w+_interactions$")


def pairs_coverage(outcomes: list[dict]) -> dict:
    """``coverage.pairs``: per operation whose interactions property ran, the covering array's
    strength, its cases, the feasible pairs of parameter values they hold (all of them, counted when
    the rows were generated) and the property's outcome. Cases moved onto an implementation's
    declared limits may hold fewer pairs than counted: the outcome is the verdict."""
    from mla_fuse_conformance.cases import interactions  # the suite's modules: verify/maps.py says why

    found = {}
    for line in outcomes:
        if line.get("when") == "call" and INTERACTIONS_TEST.search(line.get("nodeid", "")):
            operations = (line.get("metrics") or {}).get("operations") or []
            for operation in operations:
                found[operation] = {"strength": 2, "cases": len(interactions.committed_rows(operation)),
                                    "pairs": interactions.committed_pairs(operation), "outcome": line["outcome"]}
    return found


def replay(path: str | None) -> dict | None:
    if not path:
        return None
    absolute = pathlib.Path(path).absolute()
    return {"file": str(absolute), "command": recording.replay_command(absolute), "reproduced": None}


def cells(maps: list) -> list[dict]:
    """The failing cells of every map (``conformance_map.PropertyMap``), one entry each: cells of one
    property with one id (one defect the rounds found twice, joined: ``conformance_map/holds.py``) are
    one entry, the later ones' replays under ``also_replay``."""
    found = []
    by_id: dict[str, dict] = {}
    for property_map in maps:
        for cell in property_map.cells:
            diagnosis = cell.diagnosis or {}
            pair = diagnosis.get("pair")
            rate = diagnosis.get("rate")
            identity = cell_id(property_map.property, cell.kind, cell.title())
            if identity in by_id:
                by_id[identity].setdefault("also_replay", []).append(replay(cell.file))
                continue
            found.append({
                "id": identity,
                "property": property_map.property, "operations": list(property_map.operations),
                "condition": {"text": cell.title(), "data": diagnosis.get("condition"), "features": cell.features},
                "kind": cell.kind, "error": cell.error, "worst": cell.worst, "rate": rate,
                "status": None if not rate or not rate[1] else "full" if rate[0] == rate[1] else "partial",
                "pair": pair and {key: pair.get(key) for key in ("field", "passing", "failing", "file")},
                "fields": diagnosis.get("fields"), "relations": diagnosis.get("relations"),
                "necessity": diagnosis.get("necessity"), "admits": diagnosis.get("admits"),
                "source": cell.source, "found_by": cell.found_by, "replay": replay(cell.file),
                "cut_short": diagnosis.get("cut_short")})
            by_id[identity] = found[-1]
    return found


def failures(outcomes: list[dict]) -> list[dict]:
    return [dict(line["failure"], replay=replay(line["failure"].get("file")))
            for line in outcomes if line.get("failure")]


def axis_counts(outcomes: list[dict], spec: str) -> dict[str, collections.Counter]:
    """``{axis: Counter(value: examples)}`` summed over the tests' metrics (``PropertyStats.axes``)."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in outcomes:
        metrics = line.get("metrics") or {}
        if metrics.get("impl") == spec:
            for axis, values in (metrics.get("axes") or {}).items():
                counts[axis].update(values)
    return counts


@functools.lru_cache(maxsize=None)
def applicable_values(prop) -> dict[str, set[str]]:
    """Per axis, the values the property's explicit examples have or reach by ``Axis.set`` (an
    axis whose values are only drawn, such as a view into a pool, is not reached this way: those
    values count where drawn and are not listed with 0)."""
    found: dict[str, set[str]] = collections.defaultdict(set)
    for case in prop.examples:
        for axis in axes_for(prop.rotates):
            if axis.of(case) is not None:  # only the values no example before reached (Axis.set is slow)
                found[axis.name].update(value for value in axis.values
                                        if value not in found[axis.name] and axis.set(case, value) is not None)
    return found


def axes_coverage(outcomes: list[dict], impl) -> dict[str, dict[str, int]]:
    """``{axis: {value: examples}}``: every value some example had, and each value that a property
    which ran could reach and ``impl`` declares for its operations, with 0 where no example had it."""
    from mla_fuse_conformance.running.harness import all_properties  # the suite's modules: verify/maps.py says why

    counts = axis_counts(outcomes, impl.spec)
    properties, expected, ran = all_properties(), collections.defaultdict(set), {}
    for line in outcomes:
        metrics = line.get("metrics") or {}
        path, _, function = line["nodeid"].partition("::")
        prop = properties.get(f"{pathlib.PurePath(path).stem}:{function.partition('[')[0]}")
        if metrics.get("impl") == impl.spec and prop is not None and not prop.needs_input_checks:
            ran[prop.name] = prop  # once per property, not per test (its values take milliseconds an example)
    for prop in ran.values():
        for axis, values in applicable_values(prop).items():
            expected[axis].update(value for value in values if all(
                value in impl.caps(op).allowed(axis, None) for op in prop.operations))
    return {axis.name: {value: counts[axis.name][value] for value in axis.values
                        if counts[axis.name][value] or value in expected[axis.name]}
            for axis in AXES if axis.name in counts or expected[axis.name]}


def coverage(outcomes: list[dict], impl, deployment_verdicts: list[dict]) -> dict:
    """report.json's ``coverage``."""
    axes = axes_coverage(outcomes, impl)
    counted = [line.get("metrics") or {} for line in outcomes]
    events = {event: sum(int(metrics.get(field, 0)) for metrics in counted if metrics.get("impl") == impl.spec)
              for event, field in COUNTED_EVENTS.items()}
    events.update({event: axes.get(axis, {}).get(value, 0) for event, (axis, value) in VALUE_EVENTS.items()})
    verdicts = collections.Counter(entry["verdict"] for entry in deployment_verdicts)
    return {"axes": axes, "events": events, "pairs": pairs_coverage(outcomes),
            "deployments": {"run": sum(n for verdict, n in verdicts.items() if verdict not in (UNSUPPORTED, "skipped")),
                            "passed": verdicts["pass"], UNSUPPORTED: verdicts[UNSUPPORTED]}}


def deployment_verdict(line: dict) -> str:
    if line["outcome"] == "passed":
        return "pass"
    if line["outcome"] == "skipped":
        return UNSUPPORTED if str(line.get("reason", "")).startswith(UNSUPPORTED + ": ") else "skipped"
    kind = (line.get("failure") or {}).get("kind", "")
    return "crash" if kind.startswith("crashed") else "hang" if kind.startswith("hung") else "fail"


def deployments(outcomes: list[dict], maps: list) -> list[dict]:
    """One entry per deployment test (``test_<operation>_in_deployment[<name>]``) that ran."""
    named = {deployment.name: deployment for deployment in DEPLOYMENTS}
    mapped = cells(maps)
    found = []
    for line in outcomes:
        match = DEPLOYMENT_TEST.search(line["nodeid"])
        if match is None:
            continue
        deployment = named.get(match["name"])
        source = ("user" if deployment is None else
                  f"{deployment.model_name} TP {deployment.tp}, {deployment.layout}: {', '.join(deployment.sources)}")
        failure = line.get("failure") or {}
        verdict = deployment_verdict(line)
        found.append({"name": match["name"], "source": source, "operation": match["operation"], "verdict": verdict,
                      "reason": line.get("reason") if verdict in (UNSUPPORTED, "skipped") else None,
                      "cell": cell_of(failure, mapped),
                      "replay": replay(failure.get("file")), "seconds": line.get("duration")})
    return found


def cell_of(failure: dict, mapped: list[dict]) -> str | None:
    """The id of the map's cell of ``failure``'s property whose feature values it has, or None (a cell
    whose diagnosis was cut short names no failure: its feature values are not all known)."""
    features = failure.get("features") or {}
    for cell in mapped:
        if cell["property"] == failure.get("property") and not cell.get("cut_short") and \
                all(features.get(axis) == value for axis, value in cell["condition"]["features"].items()):
            return cell["id"]
    return None


def coverage_lines(found: dict) -> list[str]:
    """The printed coverage summary."""
    lines = ["coverage (examples per feature value; 0: declared by the implementation, exercised by none):"]
    for axis, values in found["axes"].items():
        lines.append(f"  {axis}: " + ", ".join(f"{value} {count}" for value, count in values.items()))
    lines.append("  events: " + ", ".join(f"{event} {count}" for event, count in found["events"].items()))
    runs = found["deployments"]
    lines.append(f"  deployments: {runs['run']} run, {runs['passed']} passed, {runs[UNSUPPORTED]} {UNSUPPORTED}")
    for operation, pairs in found.get("pairs", {}).items():
        lines.append(f"  interactions of {operation}: all {pairs['pairs']} feasible pairs of feature values and size "
                     f"crossings in {pairs['cases']} cases (strength {pairs['strength']}): {pairs['outcome']}")
    zero = [f"{axis} {value}" for axis, values in found["axes"].items() for value, count in values.items() if not count]
    zero += [event for event, count in found["events"].items() if not count]
    if zero:
        lines.append(f"  exercised by no example: {', '.join(zero)}")
    return lines


def report(run: dict, environment: dict, implementation: dict, operations: dict, outcomes: list[dict], maps: list,
           limits: list, coverage: dict, deployments: list[dict]) -> dict:
    """report.json: ``maps`` keeps schema 1's per-property maps (their passing examples per feature
    value are in no other field); ``baseline`` is not written yet."""
    found = cells(maps)
    return {"schema": SCHEMA, "run": run, "environment": environment, "implementation": implementation,
            "verdict": "FAIL" if run["exit_code"] else "PASS", "operations": operations, "coverage": coverage,
            "deployments": deployments, "cells": found, "defects": defects(found), "failures": failures(outcomes),
            "limits": [dataclasses.asdict(check) for check in limits], "maps": [dataclasses.asdict(m) for m in maps]}


def write(report_dir: pathlib.Path, report: dict) -> pathlib.Path:
    """``report_dir/report.json``, replaced whole (a reader, or a signal, never finds half a file)."""
    path = pathlib.Path(report_dir) / REPORT_FILE
    recording.write_atomic(path, json.dumps(report, indent=2) + "\n")
    return path


def junit_properties(path: pathlib.Path, found: dict, described: dict) -> None:
    """Add the environment and the implementation to each test suite of the JUnit file as ``<property>``s."""
    if not path.exists():
        return
    tree = ElementTree.parse(path)
    suites = [tree.getroot()] if tree.getroot().tag == "testsuite" else list(tree.getroot().iter("testsuite"))
    flat = {"mla_fuse.implementation": described["spec"], "mla_fuse.implementation.version": described["version"],
            **{f"mla_fuse.{name}": found[name] for name in ("python", "torch", "triton", "hypothesis", "mla_fuse",
                                                              "platform", "backend")},
            "mla_fuse.device": " ".join(str(value) for value in found["device"].values()),
            "mla_fuse.cpu": found["cpu"]["model"], "mla_fuse.cpu.flags": " ".join(found["cpu"]["flags"])}
    for suite in suites:
        properties = suite.find("properties")
        if properties is None:
            properties = ElementTree.Element("properties")
            suite.insert(0, properties)
        for name, value in flat.items():
            ElementTree.SubElement(properties, "property", name=name, value="" if value is None else str(value))
    tree.write(path, encoding="utf-8", xml_declaration=True)
