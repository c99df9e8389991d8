"""``mla-fuse verify``: run the conformance suite against an implementation and report.

1. Load the implementation here first: one that does not import, or provides none of the
   operations, stops the run with one line (exit status 2). Print its declarations, the
   operations it provides (and names that look like misspelled ones), and its declared limits.
2. Run the property suite: ``python -m pytest --pyargs mla_fuse_conformance`` with pytest-xdist,
   so a kernel that crashes kills one worker, not the run (the crashing example is saved as a
   failure file by the plugin). Outcomes and metrics come from pytest's report hooks
   (``outcomes.jsonl``, written by the plugin), not from parsing JUnit; ``junit.xml`` is still
   written for CI services.
3. Write report.json and its views (the properties' verdict, before the map), then, for every failing
   property, the most failing tests first, build its conformance map (``maps.py``,
   ``conformance_map/property_map.py``): which feature values fail, each failing cell with its replay
   file, and which pass; the report rewritten after each map. ``--map-seconds`` bounds this phase; a
   SIGTERM or SIGINT stops it (``stopping.py``), the report then written from what was mapped.
4. Check each declared limit with a few cases just outside it.
5. Print the report (what ran first: implementation, versions, device, CPU flags; the coverage
   summary last), write ``report.json`` (schema 2, docs/REPORT.md: ``report/document.py``,
   ``report/environment.py``), a standalone script per failing cell, run (``repro/script.py``), its views
   (``report.html``, ``summary.md``: ``report/views.py``; no reproducers after a signal) and the
   environment into ``junit.xml``; exit 0 when everything passed, 1 otherwise; with ``--baseline`` /
   ``--known-failures``, 0 when no failing id is new (``conformance_map/baseline.py``).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import sys
import textwrap
import time

from mla_fuse_conformance.commands.conformance_map import baseline

from mla_fuse_conformance.commands.report import environment

from mla_fuse_conformance.commands import progress

from mla_fuse_conformance.commands.report import document as report_json

from mla_fuse_conformance.commands.report import defects
from mla_fuse_conformance.commands.report import views as report_views

from mla_fuse_conformance.commands.repro import script as reproducer
from mla_fuse_conformance.commands.verify import maps, stopping
from mla_fuse_conformance.commands.verify.maps import failing_properties, property_of_test_id  # noqa: F401 - verify's API
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import devices, recording
from mla_fuse_conformance.cases.features import describe
from mla_fuse_conformance.contract.implementation import ImplementationError, load_implementation
from mla_fuse_conformance.declarations.operations import OPERATIONS, ROTATING_OPERATIONS
from mla_fuse_conformance.declarations.property_modules import COMPILE_PASS_MODULES, PASSES_IMPLEMENTATION, SUITE_DIR
from mla_fuse_conformance.running.recording import OUTCOMES_FILE

SUITE_PACKAGE = "mla_fuse_conformance"
# The dev profile (a local verdict in minutes) bounds hypothesis' shrinking of each failing property to this
# many seconds (``--mla-fuse-shrink-seconds``; hypothesis' own bound is 300): a compile-pass example costs
# seconds, and one failing case shrank for five minutes. The case found by then is reported and replayed.
DEV_SHRINK_SECONDS = 60
# rows of the tests that check no single operation's examples, by test module
OTHER_ROWS = {"test_compile_passes": "compile passes (Inductor)", "test_large_addresses": "addresses past 2^31"}
TABLE_KEY = (
    "key: rope bound used = max |impl - exact| / CONTRACT §5 bound over the rotated values (exact: the float64 "
    "reference), passes <= 1, 0.5 = correctly rounded; rope ulps = max |impl - exact| / spacing of the output dtype "
    "at |exact|, not a criterion (large where a rotation cancels: the bound's 2^-22 (|a*c| + |b*s|) term allows it); "
    "fp8 codes = max distance between fp8 codes as ordered integers, passes <= 1; padded / saturated = examples with "
    "a padded slot / a saturated fp8 code; examples = cases run; passed / failed / skipped = tests.")

MAP_KEY = (
    "key: fails <cell>: the conditions (fields of the case, relations between them) the failure needs, and how it "
    "failed; fails k/n: the share of random cases inside the cell that fail; partial (k < n): a failing and a passing "
    "example one field apart; replay: the command that reruns the failing example; passes <axis>: <value>: <count>: "
    "passing examples with that feature value.")
LIMITS_KEY = (
    "key: refused: cases just outside the declared limit raised before writing anything (every byte unchanged); "
    "unguarded: such a case ran and gave a wrong result, wrote then raised (stray write), crashed or hung: a finding "
    "that fails the verdict, with its replay, unless the adapter says which caller guards it (guarded by its caller: "
    "listed, not failing); handled: such cases pass (the limit could be widened), counted only "
    "from cases that wrote an entry or rotated a row; not reached: no case with that value could be drawn, or none "
    "of those drawn did that work.")


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
    from mla_fuse_conformance.running.harness import all_properties

    properties = all_properties()
    summaries: dict[str, OperationSummary] = {}
    for line in outcomes:
        metrics = line.get("metrics") or {}
        if metrics.get("impl") != spec:
            metrics = {}
        prop = property_of_test_id(line["nodeid"], properties)
        # a failure, or a deployment the declarations leave out, counts for its property's operations
        declared_out = (line["outcome"] == "skipped"
                        and str(line.get("reason", "")).startswith(report_json.UNSUPPORTED))
        operations = (metrics.get("operations") or (line.get("failure") or {}).get("operations")
                      or (prop.operations if prop is not None and (line["outcome"] == "failed" or declared_out)
                          else [other_row(line["nodeid"])]))
        for operation in operations:
            summary = summaries.setdefault(operation, OperationSummary())
            summary.count(line["outcome"])
            summary.fold(metrics)
    return summaries


def other_row(nodeid: str) -> str:
    """The row of a test that checks no single operation's examples: named for its test module."""
    stem = pathlib.PurePath(nodeid.partition("::")[0]).stem
    return OTHER_ROWS.get(stem, stem)


def format_table(summaries: dict[str, OperationSummary]) -> str:
    header = ("operation", "examples", "rope bound used", "rope ulps", "fp8 codes", "padded", "saturated",
              "passed", "failed", "skipped", "verdict")
    rows = [header]
    for op in (op for op in OPERATIONS if op in summaries):
        s = summaries[op]
        rows.append((op, str(s.examples), f"{s.worst_rope_bound_fraction:.3g}", f"{s.worst_rope_ulps:.3g}",
                     str(s.worst_fp8_code_diff), str(s.padded_slot_cases), str(s.saturation_cases), str(s.passed),
                     str(s.failed), str(s.skipped), s.verdict))
    others = [("other checks (no one operation's examples)", "passed", "failed", "skipped", "verdict")]
    others += [(name, str(s.passed), str(s.failed), str(s.skipped), s.verdict)
               for name, s in sorted(summaries.items()) if name not in OPERATIONS]
    return "\n".join([*aligned(rows), wrapped(TABLE_KEY), *(["", *aligned(others)] if len(others) > 1 else [])])


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` (the first the header) as columns padded to their widest cell, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


def wrapped(key: str) -> str:
    return "\n".join(textwrap.wrap(key, 110, subsequent_indent="     "))


def describe_implementation(impl) -> list[str]:
    """The declarations, the operations found, and the declared limits, as report lines."""
    provided, missing = impl.operations, [op for op in OPERATIONS if not impl.provides(op)]
    lines = [f"implementation: {impl.title}: rounding {impl.rounding}, padded rows {impl.padded_rows}, "
             f"checks inputs {'yes' if impl.checks_inputs else 'no'}",
             f"operations found: {', '.join(provided)}"]
    if missing:
        required = [op for op in missing if op in impl.required]
        lines.append(f"not provided: {', '.join(missing)}" + (f" (REQUIRED: {', '.join(required)} fail)" if required
                                                               else " (their properties are not run)"))
    for attr, op in impl.near_misses.items():
        lines.append(f"warning: {attr!r} is not an operation of the contract; did you mean {op!r}?"
                     + ("" if op in impl.required else " (--require it to make its absence a failure)"))
    for op in provided:
        rotates = op in ROTATING_OPERATIONS
        limits = impl.caps(op).describe(rotates)
        lines.append(f"declared limits of {op}: " + ("; ".join(limits) if limits else "none (the whole contract)"))
    return lines


def not_run(impl, profile: str) -> list[str]:
    """What the suite leaves out for ``impl`` in ``profile`` (the plugin deselects the properties
    that would only skip; ``test_large_addresses`` skips in the profiles it names)."""
    from mla_fuse_conformance.properties import test_large_addresses as large

    missing = [op for op in OPERATIONS if not impl.provides(op) and op not in impl.required]
    lines = [f"the properties of {', '.join(missing)} (not provided)"] if missing else []
    if not impl.checks_inputs:
        lines.append("bad-input properties: the implementation declares checks_inputs=False")
    if ignored_modules(impl.spec):
        lines.append("compile passes: they call mla_fuse's own ops, so they check the triton implementation only")
    if profile in large.SKIPPED_IN_PROFILES:
        lines.append(f"large addresses: {large.NOT_RUN}")
    return lines


def pytest_command(spec: str, profile: str, report_dir: pathlib.Path, workers: str, require: tuple[str, ...],
                   extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "--pyargs", SUITE_PACKAGE, f"--mla-fuse-impl={spec}",
            *([f"--mla-fuse-require={','.join(require)}"] if require else []),
            f"--hypothesis-profile={profiles.full_name(profile)}", f"--junitxml={report_dir.absolute() / 'junit.xml'}",
            *([f"--mla-fuse-shrink-seconds={DEV_SHRINK_SECONDS:g}"] if profile == "dev" else []),
            "-p", "no:cacheprovider", *([] if sys.stdout.isatty() else ["-p", progress.PLUGIN]), "-n", workers,
            "--tb=line", *ignored_modules(spec), *extra]  # one line per failure: the report below has each
    # failure's case, features and replay command (hypothesis' printed examples ran to thousands of lines;
    # `-- --tb=long` brings them back: the last --tb wins)


def ignored_modules(spec: str) -> list[str]:
    """The compile-pass properties call ``mla_fuse``'s own ops, so they apply to ``triton`` only;
    for another implementation their module is not even imported (Inductor: 3 s per process)."""

    if spec == PASSES_IMPLEMENTATION:
        return []
    return [f"--ignore={SUITE_DIR / module}.py" for module in COMPILE_PASS_MODULES]


def run_verify(impl_spec: str | None, profile: str, report_dir: pathlib.Path, workers: str | None,
               extra_pytest_args: list[str], require: tuple[str, ...] = (), map_rounds: int = 6,
               known: baseline.Known | None = None, write_known: pathlib.Path | None = None,
               map_seconds: float = maps.DEFAULT_SECONDS) -> int:
    started_at, started = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    triton_kernels = devices.triton_kernels_for_the_run()  # before the adapter is imported
    try:
        impl = load_implementation(impl_spec, require)
    except ImplementationError as error:
        print(f"mla-fuse verify: {error}", file=sys.stderr)
        return 2
    header = describe_implementation(impl)
    found, described = environment.environment(), environment.implementation(impl, header)
    found["adapter_triton_kernels"] = triton_kernels
    print_what_ran(impl, profile, found, described["version"], header)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / OUTCOMES_FILE).unlink(missing_ok=True)
    command = pytest_command(impl.spec, profile, report_dir, workers or "auto", impl.required, extra_pytest_args)
    env = dict(os.environ, MLA_FUSE_REPORT_DIR=str(report_dir),
               PYTHONPATH=os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]))
    shown = {name: str(pathlib.Path(env[name]).absolute()) if name == "MLA_FUSE_REPORT_DIR" else env[name]
             for name in ("PYTHONPATH", "MLA_FUSE_REPORT_DIR")}  # as run, pasteable: its environment as a prefix
    returncode, signalled = stopping.run_child(command, env, lambda: print(
        f"$ {' '.join(f'{name}={shlex.quote(value)}' for name, value in shown.items())} {shlex.join(command)}",
        flush=True))
    if signalled:
        print(f"mla-fuse verify: stopped by {signalled} before the properties ended: no verdict, no report.json "
              "(exit 2)", file=sys.stderr)
        return 2
    phases = {"properties": round(time.monotonic() - started, 1)}
    outcomes = read_outcomes(report_dir / OUTCOMES_FILE)
    summaries = summarize(outcomes, impl.spec)
    failed = returncode not in (0, 5) or any(s.failed for s in summaries.values()) or not outcomes
    phase = maps.MapPhase(maps.to_map(outcomes), map_rounds, map_seconds, bool(maps.declared_limits(impl)))
    operations = {op: {**dataclasses.asdict(s), "verdict": s.verdict} for op, s in summaries.items()}
    run = {"command": command_line(), "cwd": os.getcwd(), "started": started_at.isoformat(timespec="seconds"),
           "seconds": None, "profile": profile, "seed_policy": seed_policy(profile), "phases": phases,
           "pytest_exit_code": returncode, "exit_code": None, "map": None}

    def publish(step_summary: str | None = None) -> tuple[dict, list[pathlib.Path]]:
        """report.json and its views as things stand (a file is replaced whole: a signal leaves the last)."""
        run.update(seconds=round(time.monotonic() - started, 1), exit_code=1 if failed else 0, map=phase.as_json(),
                   phases=dict(phases))
        deployments = report_json.deployments(outcomes, phase.maps)
        coverage = report_json.coverage(outcomes, impl, deployments)
        report = report_json.report(dict(run), found, described, operations, outcomes, phase.maps, phase.limits,
                                    coverage, deployments)
        baseline.judge(report, outcomes, known)
        recording.write_atomic(report_dir / "report.json", json.dumps(report, indent=2) + "\n")
        return report, report_views.write(report_dir, step_summary)

    with stopping.Handled() as handled:
        try:
            publish()  # the properties' verdict, before the map
            if phase.running:
                print(f"mla-fuse verify: the properties' verdict ({'FAIL' if failed else 'PASS'}) is in "
                      f"{report_dir / 'report.json'}, rewritten as each map finishes; mapping {len(phase.properties)} "
                      f"failing properties, for at most {map_seconds:g} s", flush=True)
                maps.run_maps(impl, outcomes, profile, phase, phases, known.cells if known else (), on_map=publish,
                              check=handled.raise_if_signalled)
            phase.running = False
        except stopping.Stopped as stop:
            phase.stopped, phase.running = stop.name, False
        failed = failed or any(check.finding for check in phase.limits)  # unguarded, no caller's guard: a finding
        report, views = publish(os.environ.get("GITHUB_STEP_SUMMARY") if handled.signal else None)
    elapsed = time.monotonic() - started
    print_report(impl, profile, elapsed, summaries, outcomes, phase.maps, phase.limits, failed)
    print("\n".join(["", *maps.lines(report["run"]["map"])]))
    print("\n" + "\n".join(report_json.coverage_lines(report["coverage"])))
    if handled.signal:
        print(f"mla-fuse verify: stopped by {handled.signal}: no reproducers written")
    else:  # per failing cell a standalone script, run; report.json rewritten, then its views
        reproducer.write_reproducers(report_dir, report)
        views = report_views.write(report_dir, os.environ.get("GITHUB_STEP_SUMMARY"))
    report_json.junit_properties(report_dir / "junit.xml", found, described)
    if write_known:
        baseline.write_known_failures(write_known, report)
    print("\n".join(["", *defects.console_lines(report), *baseline.lines(report),
                     f"report: {report_dir / 'report.json'}, {', '.join(map(str, views))}, "
                     f"JUnit: {report_dir / 'junit.xml'}", baseline.verdict_line(report)]))
    return report["run"]["exit_code"]


def print_what_ran(impl, profile: str, found: dict, version: str | None, header: list[str]) -> None:
    """The report's first lines: the implementation and its version, the profile, the device and
    backend, the versions, the CPU's vector flags, then the declarations."""
    lines = [f"{impl.title} version {version or 'unknown'}, {profile} profile",
             *environment.describe_environment(found), *header]
    print("\n".join(f"mla-fuse verify: {line}" for line in lines), flush=True)


def seed_policy(profile: str) -> str:
    """``derandomized`` (the same examples every run) or ``random, database WHERE``."""
    from hypothesis import settings

    from mla_fuse_conformance.settings import database

    chosen = settings.get_profile(profiles.full_name(profile))
    if chosen.derandomize:
        return "derandomized"
    return f"random, database {database.shown(os.environ.get(database.DATABASE_ENV_VAR))}"


def command_line() -> str:
    """The command as typed: ``python -m mla_fuse_conformance`` where that is how it ran."""
    program = sys.argv[0]
    if pathlib.Path(program).name == "__main__.py":
        program = f"{shlex.quote(sys.executable)} -m {SUITE_PACKAGE}"
    return " ".join([program, shlex.join(sys.argv[1:])]).strip()


def print_report(impl, profile, elapsed, summaries, outcomes, maps, limits, failed) -> None:
    print(f"\nmla-fuse verify: {impl.spec} ({profile} profile, {elapsed:.0f} s)\n{format_table(summaries)}")
    print("".join(f"not run: {line}\n" for line in not_run(impl, profile)), end="")
    print("".join(f"not judged: {op}: {s.not_judged} examples too slow under Triton's interpreter (estimated up to "
                  f"{s.not_judged_estimate:.0f} s each; $MLA_FUSE_INTERPRETER_BUDGET): neither passed nor failed\n"
                  for op, s in summaries.items() if s.not_judged), end="")
    failures = [line["failure"] for line in outcomes if line.get("failure")]
    others = [line for line in outcomes if line["outcome"] == "failed" and not line.get("failure")]
    if failures or others:
        print("\nfailures:")
        for failure in failures:
            print(f"  {failure['property']}: {failure['kind']} on {describe(failure.get('features', {}))}\n"
                  + (f"      shrinking {failure['shrinking']}\n" if failure.get("shrinking") else "")
                  + f"      replay: {recording.replay_command(pathlib.Path(failure['file']))}")
        for line in others:
            errors = [text[1:].strip() for text in (line.get("message") or "").splitlines() if text.startswith("E ")]
            print(f"  {line['nodeid']}: failed" + (f": {errors[0][:300]}" if errors else ""))
    if maps:
        print("\nconformance map (failing cells, each with a replay file; then the feature values of passing examples):")
        for property_map in maps:
            print("\n".join(property_map.lines()))
        print(wrapped(MAP_KEY))
    if limits:
        print("\ndeclared limits, each checked with a few cases just outside it:")
        by_outcome = collections.Counter(check.outcome.partition(":")[0] for check in limits)
        for check in limits:
            note = {"handled": "declared unsupported, but handled"}.get(check.outcome, check.outcome)
            print(f"  {check.operation}: {check.axis} {check.value}: {note} ({check.detail})"
                  + (f"\n      guarded by its caller: {check.guarded_by}" if check.guarded_by else "")
                  + (f"\n      replay: {recording.replay_command(pathlib.Path(check.file))}" if check.file else ""))
        print(f"  ({by_outcome['unguarded']} unguarded, {by_outcome['refused']} refused, {by_outcome['handled']} "
              "handled though declared unsupported)")
        print(wrapped(LIMITS_KEY))
