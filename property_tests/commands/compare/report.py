"""What ``mla-fuse compare`` found: the counts per operation and cell, the distances between
implementations that both passed, the printed table and ``comparison.json`` (docs/REPORT.md)."""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib

from mla_fuse_conformance.commands.report import environment
from mla_fuse_conformance.commands.compare.distances import Distance
from mla_fuse_conformance.declarations.operations import OPERATIONS

OUTCOMES = ("pass", "fail", "crash", "hang", "outside declared limits")
FILE = "comparison.json"


@dataclasses.dataclass
class Row:
    """One operation and cell: each implementation's outcomes, and the distances of each pair."""

    operation: str
    cell: str
    results: dict[str, collections.Counter]
    differences: dict[tuple[str, str], Distance] = dataclasses.field(default_factory=dict)
    first_failures: dict[str, str] = dataclasses.field(default_factory=dict)

    def count(self, spec: str, outcome: str, detail) -> None:
        self.results[spec][outcome] += 1
        if outcome in ("fail", "crash", "hang") and spec not in self.first_failures:
            lines = [line.strip() for line in str(detail).strip().splitlines() if line.strip()]
            self.first_failures[spec] = f"{outcome}: {' '.join(lines[:2])[:300]}"

    def entry(self, spec: str) -> str:
        """``5/5``, ``3 pass 1 fail 1 crash``, ``-`` (every case outside the declared limits)."""
        counts = self.results[spec]
        ran = sum(counts[outcome] for outcome in OUTCOMES[:4])
        if not ran:
            return "-"
        text = (f"{counts['pass']}/{ran}" if counts["pass"] == ran else
                " ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES[:4] if counts[outcome]))
        return text + (f", {counts[OUTCOMES[4]]} -" if counts[OUTCOMES[4]] else "")

    def record(self) -> dict:
        return {"operation": self.operation, "cell": self.cell,
                "results": {spec: {outcome: counts[outcome] for outcome in OUTCOMES}
                            for spec, counts in self.results.items()},
                "differences": [{"a": a, "b": b, **distance.record()} for (a, b), distance in self.differences.items()],
                "first_failures": self.first_failures}


def difference_line(a: str, b: str, distance: Distance) -> str:
    return (f"{a} vs {b} on {distance.cases} case(s) both passed: max {distance.max_ulps:.3g} ulp, "
            f"max {distance.max_fp8_codes} fp8 code(s), {distance.passthrough_bytes} pass-through byte(s) "
            f"and {distance.cache_bytes} cache byte(s) differ")


def _identical(distance: Distance) -> bool:
    return not (distance.max_ulps or distance.max_fp8_codes or distance.passthrough_bytes or distance.cache_bytes)


class Comparison:
    """Everything one ``mla-fuse compare`` run found."""

    def __init__(self, impls: list, cases: int, profile: str, seed: int) -> None:
        self.implementations = [{"spec": impl.spec, "name": impl.name,
                                 "version": environment.implementation_version(impl)} for impl in impls]
        self.specs = [impl.spec for impl in impls]
        self.cases, self.profile, self.seed = cases, profile, seed
        self.seconds: float | None = None
        self.rows: dict[tuple[str, str], Row] = {}

    def row(self, operation: str, cell: str) -> Row:
        key = (operation, cell)
        if key not in self.rows:
            self.rows[key] = Row(operation, cell, {spec: collections.Counter() for spec in self.specs})
        return self.rows[key]

    def ordered(self) -> list[Row]:
        return sorted(self.rows.values(), key=lambda row: (OPERATIONS.index(row.operation), row.cell))

    def table(self) -> list[str]:
        header = ["operation", "cell", *self.specs]
        body = [[row.operation, row.cell, *(row.entry(spec) for spec in self.specs)] for row in self.ordered()]
        widths = [max(len(line[column]) for line in [header, *body]) for column in range(len(header))]
        return ["  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip()
                for line in [header, *body]]

    def lines(self) -> list[str]:
        out = ["", f"{self.cases} cases per operation (seed {self.seed}, {self.profile} profile); "
                   "entries: passed/ran, or counts; '-': outside the declared limits (or not provided)", "",
               *self.table(), "", "differences between implementations that both passed:"]
        identical = collections.Counter()
        for row in self.ordered():
            for (a, b), distance in row.differences.items():
                if _identical(distance):
                    identical[(a, b)] += distance.cases
                else:
                    out.append(f"  {row.operation}, {row.cell}: {difference_line(a, b, distance)}")
        out += [f"  {a} and {b}: bit for bit equal on {count} case(s)" for (a, b), count in identical.items()]
        failures = [f"  {row.operation}, {row.cell}: {spec}: {text}"
                    for row in self.ordered() for spec, text in row.first_failures.items()]
        return out + (["", "first failure of each implementation per cell:", *failures] if failures else [])

    def record(self) -> dict:
        return {"schema": 1, "implementations": self.implementations, "cases": self.cases, "profile": self.profile,
                "seed": self.seed, "seconds": self.seconds, "environment": environment.environment(),
                "rows": [row.record() for row in self.ordered()]}

    def write(self, report_dir: pathlib.Path) -> pathlib.Path:
        report_dir.mkdir(parents=True, exist_ok=True)
        path = report_dir / FILE
        path.write_text(json.dumps(self.record(), indent=1) + "\n")
        return path
