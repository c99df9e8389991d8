"""``verify``'s per-operation table, as numbers: each operation's test outcomes and the worst errors its
examples had, summed from the lines of ``outcomes.jsonl`` (written by the plugin's report hooks). The
console prints it (``verify/console.py``), report.json keeps it as ``operations``."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from mla_fuse_conformance.commands.report import document
from mla_fuse_conformance.commands.verify.maps import property_of_test_id

# rows of the tests that check no single operation's examples, by test module
OTHER_ROWS = {"test_compile_passes": "compile passes (Inductor)", "test_large_addresses": "addresses past 2^31"}


@dataclasses.dataclass
class OperationSummary:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    examples: int = 0
    worst_rope_bound_fraction: float = 0.0  # |impl - exact| / CONTRACT §5 bound: above 1 fails
    worst_rope_ulps: float = 0.0  # in ulps of the exact value (large where a rotation cancels)
    worst_fp8_code_diff: int = 0
    padded_slot_cases: int = 0
    saturation_cases: int = 0
    not_judged: int = 0  # examples too slow under Triton's interpreter (running/interpreter_watch.py)
    not_judged_estimate: float = 0.0

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        return "pass" if self.passed else "skipped"

    def count(self, outcome: str) -> None:
        if outcome == "passed":
            self.passed += 1
        elif outcome == "skipped":
            self.skipped += 1
        else:
            self.failed += 1

    def fold(self, metrics: dict) -> None:
        self.examples += int(metrics.get("examples", 0))
        self.worst_rope_bound_fraction = max(self.worst_rope_bound_fraction,
                                             float(metrics.get("worst_rope_bound_fraction", 0.0)))
        self.worst_rope_ulps = max(self.worst_rope_ulps, float(metrics.get("worst_rope_ulps", 0.0)))
        self.worst_fp8_code_diff = max(self.worst_fp8_code_diff, int(metrics.get("worst_fp8_code_diff", 0)))
        self.padded_slot_cases += int(metrics.get("padded_slot_cases", 0))
        self.saturation_cases += int(metrics.get("saturation_cases", 0))
        self.not_judged += int(metrics.get("not_judged", 0))
        self.not_judged_estimate = max(self.not_judged_estimate, float(metrics.get("not_judged_estimate", 0.0)))


def read_outcomes(path: pathlib.Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(outcomes: list[dict], spec: str) -> dict[str, OperationSummary]:
    """Per operation: outcomes and metrics of the properties exercising ``spec`` (a property over
    several operations, fused vs unfused, counts for each); a test of no single operation's examples
    counts in a row named for its module (``OTHER_ROWS``)."""
    from mla_fuse_conformance.running.harness import all_properties  # the suite's modules: verify/maps.py says why

    properties = all_properties()
    summaries: dict[str, OperationSummary] = {}
    for line in outcomes:
        metrics = line.get("metrics") or {}
        if metrics.get("impl") != spec:
            metrics = {}
        prop = property_of_test_id(line["nodeid"], properties)
        # a failure, or a deployment the declarations leave out, counts for its property's operations
        declared_out = (line["outcome"] == "skipped"
                        and str(line.get("reason", "")).startswith(document.UNSUPPORTED))
        operations = (metrics.get("operations") or (line.get("failure") or {}).get("operations")
                      or (prop.operations if prop is not None and (line["outcome"] == "failed" or declared_out)
                          else [other_row(line["nodeid"])]))
        for operation in operations:
            summary = summaries.setdefault(operation, OperationSummary())
            summary.count(line["outcome"])
            summary.fold(metrics)
    return summaries


def as_json(summaries: dict[str, OperationSummary]) -> dict[str, dict]:
    """report.json's ``operations``: each summary's fields and its verdict."""
    return {op: {**dataclasses.asdict(s), "verdict": s.verdict} for op, s in summaries.items()}


def other_row(nodeid: str) -> str:
    """The row of a test that checks no single operation's examples: named for its test module."""
    stem = pathlib.PurePath(nodeid.partition("::")[0]).stem
    return OTHER_ROWS.get(stem, stem)
