"""What the properties leave behind: failure files for replay, and per-property metrics.

Failures. The last failing example of a property (hypothesis replays the shrunk one
last) is kept here; the conftest writes it to ``$MLA_FUSE_FAILURE_DIR`` (default
``.mla_fuse_failures/`` at the repository root) as a small JSON file (property,
implementation, device, the case with its seed) that ``python -m mla_fuse_conformance.repro``
replays without hypothesis.

Metrics. With ``$MLA_FUSE_REPORT_DIR`` set, every property run appends one JSON line to
``properties-<xdist worker or "main">.jsonl`` there:
``{"property", "variant", "operations", "impl", "examples", "failed_examples", "worst_rope_ulps",
"worst_rope_bound_fraction",
"worst_fp8_code_diff", "padded_slot_cases", "saturation_cases", "outcome"}`` (``variant``: the
corruption of a bad-input property, else null).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shlex

from mla_fuse_conformance import cases as case_types

FAILURE_DIR_ENV = "MLA_FUSE_FAILURE_DIR"
REPORT_DIR_ENV = "MLA_FUSE_REPORT_DIR"
SESSION_ENV_VAR = "MLA_FUSE_SESSION_ID"


def failure_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(FAILURE_DIR_ENV) or ".mla_fuse_failures").absolute()


def worker_name() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@dataclasses.dataclass
class PropertyStats:
    property: str
    operations: tuple[str, ...]
    impl: str
    variant: str | None = None  # the corruption of a bad-input property
    examples: int = 0
    failed_examples: int = 0
    worst_rope_ulps: float = 0.0
    worst_rope_bound_fraction: float = 0.0  # |impl - exact| / CONTRACT §5 bound; above 1 fails
    worst_fp8_code_diff: int = 0
    padded_slot_cases: int = 0
    saturation_cases: int = 0

    def as_record(self, outcome: str) -> dict:
        record = dataclasses.asdict(self)
        record["operations"] = list(self.operations)
        record["worst_rope_ulps"] = round(self.worst_rope_ulps, 4)
        record["worst_rope_bound_fraction"] = round(self.worst_rope_bound_fraction, 4)
        record["outcome"] = outcome
        return record


class Recorder:
    """Per-process state of the property being run (pytest runs one test at a time per process)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.stats: PropertyStats | None = None
        self.last_failure: dict | None = None

    def stats_for(self, prop, impl, variant: str | None = None) -> PropertyStats:
        if self.stats is None or (self.stats.property, self.stats.variant) != (prop.name, variant):
            self.stats = PropertyStats(prop.name, prop.operations, impl.spec, variant)
        return self.stats

    def observe(self, outcome) -> None:
        """Fold one comparison's measurements (comparisons.Outcome) into the property's metrics."""
        if self.stats is not None:
            self.stats.worst_rope_ulps = max(self.stats.worst_rope_ulps, outcome.worst_rope_ulps)
            self.stats.worst_rope_bound_fraction = max(self.stats.worst_rope_bound_fraction,
                                                       outcome.worst_rope_bound_fraction)
            self.stats.worst_fp8_code_diff = max(self.stats.worst_fp8_code_diff, outcome.worst_fp8_code_diff)

    def failed(self, prop, impl, device, case, error: BaseException) -> None:
        self.last_failure = {
            "property": prop.name, "impl": impl.spec, "device": str(device),
            "case": case_types.to_jsonable(case), "error_type": type(error).__name__, "error": str(error)[:4000],
        }


RECORDER = Recorder()


def replay_command(path: pathlib.Path) -> str:
    try:
        shown = path.resolve().relative_to(pathlib.Path.cwd())
    except ValueError:
        shown = path
    return f"mla-fuse repro {shlex.quote(str(shown))}"


def save_failure(failure: dict, nodeid: str, profile: str) -> pathlib.Path:
    """Write ``failure`` (from ``Recorder.failed``) as a replayable file; return its path."""
    import hypothesis

    text = json.dumps(failure["case"], sort_keys=True)
    digest = hashlib.sha1((failure["property"] + failure["impl"] + text).encode()).hexdigest()[:10]
    short = failure["property"].rpartition(":")[2]
    name = f"{short}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', failure['impl'])}-{digest}.json"
    directory = failure_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    record = dict(failure, nodeid=nodeid, profile=profile, hypothesis_version=hypothesis.__version__)
    record["replay"] = replay_command(path)
    record["pytest"] = f"python -m pytest {shlex.quote(nodeid)} --impl={shlex.quote(failure['impl'])} " \
                       f"--hypothesis-profile={profile}"
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def describe_failure(failure: dict, path: pathlib.Path, nodeid: str, profile: str) -> str:
    """The text shown under a failing property: seed, shrunk case, and how to replay it."""
    case = case_types.from_jsonable(failure["case"])
    seed = case.base.seed if isinstance(case, case_types.BadInputCase) else case.seed
    return "\n".join([
        f"implementation: {failure['impl']}   device: {failure['device']}   case seed: {seed}",
        f"shrunk case:    {case!r}",
        f"saved to:       {path}",
        f"replay exactly: {replay_command(path)}",
        f"or with pytest: python -m pytest {shlex.quote(nodeid)} --impl={shlex.quote(failure['impl'])} "
        f"--hypothesis-profile={profile}   (derandomized profiles regenerate it; others replay it from the "
        f"example database)",
        f"keep it:        add {case!r} to the property's examples=[...] (names from mla_fuse_conformance.cases)",
    ])


def append_metrics(stats: PropertyStats | None, outcome: str) -> None:
    directory = os.environ.get(REPORT_DIR_ENV)
    if not directory or stats is None:
        return
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    with open(path / f"properties-{worker_name()}.jsonl", "a") as stream:
        stream.write(json.dumps(stats.as_record(outcome), sort_keys=True) + "\n")


# ---------------------------------------------------------------- the mutation self-test's report


def report_dir_or_default() -> pathlib.Path:
    return pathlib.Path(os.environ.get(REPORT_DIR_ENV) or ".mla_fuse_reports").absolute()


def append_mutant_result(row: dict) -> None:
    """One line per mutant in ``mutants.jsonl`` (tests/test_mutants.py)."""
    directory = report_dir_or_default()
    directory.mkdir(parents=True, exist_ok=True)
    row = dict(row, session=os.environ.get(SESSION_ENV_VAR), worker=worker_name())
    with open(directory / "mutants.jsonl", "a") as stream:
        stream.write(json.dumps(row, sort_keys=True) + "\n")


def mutant_table(rows: list[dict]) -> list[str]:
    lines = [f"{'mutant':38} {'result':9} {'seconds':>8} {'examples':>8}  caught by"]
    for row in sorted(rows, key=lambda r: r["mutant"]):
        lines.append(f"{row['mutant']:38} {row['result']:9} {row['seconds']:8.2f} {row['examples']:8d}  "
                     f"{row.get('property') or '-'}")
    return lines
