"""The main job: run the conformance suite against an implementation and report per operation.

The suite runs in a subprocess (``python -m pytest property_tests ...``) so that
a crashing kernel cannot take the report down with it, and because ``mla_fuse``
never imports the suite (imports point one way). Outcomes come from the JUnit
XML that pytest writes; numerical metrics come from the JSON lines that the
properties append under ``$MLA_FUSE_REPORT_DIR`` (see property_tests/README.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

from mla_fuse_conformance import profiles
from mla_fuse_conformance.implementation import OPERATIONS, resolve_spec

SUITE_PACKAGE = "mla_fuse_conformance"
GENERAL = "general"  # properties that belong to no single operation


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

    @property
    def verdict(self) -> str:
        if self.failed:
            return "FAIL"
        return "pass" if self.passed else "skipped"


def count_outcome(summary: OperationSummary, outcome: str) -> None:
    if outcome == "passed":
        summary.passed += 1
    elif outcome == "skipped":
        summary.skipped += 1
    else:
        summary.failed += 1


def read_junit(path: pathlib.Path, summaries: dict[str, OperationSummary], measured: set[str]) -> None:
    """Outcomes of the tests that left no metric line (the suite's self-checks) count as general."""
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rpartition(".")[2]
        if f"{module}:{case.get('name', '').partition('[')[0]}" in measured:
            continue
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        count_outcome(summaries.setdefault(GENERAL, OperationSummary()),
                      "failed" if failed else "skipped" if skipped else "passed")


def read_metrics(report_dir: pathlib.Path, spec: str, summaries: dict[str, OperationSummary]) -> set[str]:
    """Fold the suite's metric lines (one JSON object per property run) of implementation ``spec``.

    A property that exercises several operations (fused vs unfused) counts for each. Lines of
    other implementations (the suite's self-checks run mutants on purpose) are left out.
    Returns the ``module:test`` names that were measured.
    """
    measured = set()
    for path in sorted(report_dir.glob("properties-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("impl") != spec:
                continue
            measured.add(record["property"].rpartition(".")[2])
            for operation in record.get("operations") or [GENERAL]:
                summary = summaries.setdefault(operation, OperationSummary())
                count_outcome(summary, record.get("outcome", "failed"))
                summary.examples += int(record.get("examples", 0))
                summary.worst_rope_bound_fraction = max(summary.worst_rope_bound_fraction,
                                                        float(record.get("worst_rope_bound_fraction", 0.0)))
                summary.worst_rope_ulps = max(summary.worst_rope_ulps, float(record.get("worst_rope_ulps", 0.0)))
                summary.worst_fp8_code_diff = max(summary.worst_fp8_code_diff,
                                                  int(record.get("worst_fp8_code_diff", 0)))
                summary.padded_slot_cases += int(record.get("padded_slot_cases", 0))
                summary.saturation_cases += int(record.get("saturation_cases", 0))
    return measured


def format_table(summaries: dict[str, OperationSummary]) -> str:
    header = ("operation", "examples", "rope bound used", "rope ulps", "fp8 codes", "padded", "saturated",
              "passed", "failed", "skipped", "verdict")
    rows = [header]
    for op in [*OPERATIONS, GENERAL]:
        if op not in summaries:
            continue
        s = summaries[op]
        rows.append((op, str(s.examples), f"{s.worst_rope_bound_fraction:.3f}", f"{s.worst_rope_ulps:.3g}",
                     str(s.worst_fp8_code_diff),
                     str(s.padded_slot_cases), str(s.saturation_cases), str(s.passed), str(s.failed),
                     str(s.skipped), s.verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def run_verify(impl: str | None, profile: str, report_dir: pathlib.Path, workers: str | None,
               extra_pytest_args: list[str]) -> int:
    spec = resolve_spec(impl)
    report_dir.mkdir(parents=True, exist_ok=True)
    for stale in report_dir.glob("properties-*.jsonl"):
        stale.unlink()
    junit = report_dir / "junit.xml"
    command = [sys.executable, "-m", "pytest", "--pyargs", SUITE_PACKAGE, f"--impl={spec}",
               f"--hypothesis-profile={profiles.full_name(profile)}",
               f"--junitxml={junit}", "-p", "no:cacheprovider", *(["-n", workers] if workers else []),
               *extra_pytest_args]
    print(f"mla_fuse verify: implementation {spec!r}, profile {profile!r}\n$ {' '.join(command)}", flush=True)
    started = time.monotonic()
    returncode = subprocess.call(command, env={**os.environ, "MLA_FUSE_REPORT_DIR": str(report_dir)})
    elapsed = time.monotonic() - started

    summaries: dict[str, OperationSummary] = {}
    measured = read_metrics(report_dir, spec, summaries)
    if junit.exists():
        read_junit(junit, summaries, measured)
    failed = returncode != 0 or any(s.failed for s in summaries.values())
    print(f"\nmla_fuse verify: {spec} ({profile} profile, {elapsed:.0f} s)\n{format_table(summaries)}")
    report = {"implementation": spec, "profile": profile, "seconds": round(elapsed, 1), "pytest_exit_code": returncode,
              "passed": not failed, "operations": {op: {**dataclasses.asdict(s), "verdict": s.verdict}
                                                   for op, s in summaries.items()}}
    (report_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nreport: {report_dir / 'report.json'}, JUnit: {junit}\nverdict: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0
