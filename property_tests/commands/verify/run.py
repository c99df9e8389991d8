"""``mla-fuse verify``: run the conformance suite against an implementation and report.

``run_verify`` is the command, one named step after another:

1. ``load``: the implementation, imported here first: one that does not import, or provides none of
   the operations, stops the run with one line (exit status 2). ``announce`` prints its
   declarations, the operations it provides (and names that look like misspelled ones), its
   declared limits, and the environment (``verify/console.py``).
2. ``run_properties``: ``python -m pytest --pyargs mla_fuse_conformance`` with pytest-xdist, so a kernel
   that crashes kills one worker, not the run (the crashing example is saved as a failure file by
   the plugin). Outcomes and metrics come from pytest's report hooks (``outcomes.jsonl``, written by
   the plugin), not from parsing JUnit; ``junit.xml`` is still written for CI services. A SIGTERM or
   SIGINT here ends the child and the run: exit status 2, no report (``stopping.py``).
3. ``map_failures``: write report.json and its views (the properties' verdict, before the map),
   then, for every failing property, the most failing tests first, build its conformance map
   (``maps.py``, ``conformance_map/property_map.py``): which feature values fail, each failing cell with
   its replay file, and which pass; the report rewritten after each map. Then check each declared limit
   with a few cases just outside it. ``--map-seconds`` bounds this phase; a SIGTERM or SIGINT stops it
   (``stopping.py``), the report then written from what was mapped.
4. ``console.print_report``: the per-operation table (``verify/summary.py``), the failures, the map, the limits
   and the coverage.
5. ``add_reproducers``: a standalone script per failing cell, run (``repro/script.py``; none after a
   signal), and the report written again.
6. ``finish``: the environment into ``junit.xml``, the known-failures file if asked, the closing lines;
   exit 0 when everything passed, 1 otherwise; with ``--baseline`` / ``--known-failures``, 0 when no
   failing id is new (``conformance_map/baseline.py``).

Each report.json (schema 2, docs/REPORT.md) is made whole by ``report_of`` from what the properties left
(``PropertiesRan``) and how far the map got, and written by ``publish``: ``report/document.py``'s
``write`` (the one writer of report.json), then its views (``report.html``, ``summary.md``:
``report/views.py``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import shlex
import sys
import time

from hypothesis import settings

from mla_fuse_conformance.commands import progress
from mla_fuse_conformance.commands.conformance_map import baseline
from mla_fuse_conformance.commands.report import document, environment, views
from mla_fuse_conformance.commands.repro import script
from mla_fuse_conformance.commands.verify import console, maps, stopping, summary
from mla_fuse_conformance.contract.implementation import ImplementationError, load_implementation
from mla_fuse_conformance.declarations.property_modules import COMPILE_PASS_MODULES, PASSES_IMPLEMENTATION, SUITE_DIR
from mla_fuse_conformance.running import devices
from mla_fuse_conformance.running.recording import OUTCOMES_FILE
from mla_fuse_conformance.settings import database, profiles

SUITE_PACKAGE = "mla_fuse_conformance"
# The dev profile (a local verdict in minutes) bounds hypothesis' shrinking of each failing property to this
# many seconds (``--mla-fuse-shrink-seconds``; hypothesis' own bound is 300): a compile-pass example costs
# seconds, and one failing case shrank for five minutes. The case found by then is reported and replayed.
DEV_SHRINK_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class PropertiesRan:
    """What the run of the properties left: the part of report.json that the map does not change."""

    impl: object  # contract.implementation.Implementation
    profile: str
    environment: dict
    implementation: dict  # report.json's ``implementation``
    command: str
    cwd: str
    started_at: datetime.datetime
    started: float  # time.monotonic() when verify started
    seed_policy: str
    pytest_exit_code: int | None
    outcomes: list[dict]
    summaries: dict[str, summary.OperationSummary]
    known: baseline.Known | None

    @property
    def failed(self) -> bool:
        return (self.pytest_exit_code not in (0, 5) or any(s.failed for s in self.summaries.values())
                or not self.outcomes)


def run_verify(impl_spec: str | None, profile: str, report_dir: pathlib.Path, workers: str | None,
               extra_pytest_args: list[str], require: tuple[str, ...] = (), map_rounds: int = 6,
               known: baseline.Known | None = None, write_known: pathlib.Path | None = None,
               map_seconds: float = maps.DEFAULT_SECONDS) -> int:
    started_at, started = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    triton_kernels = devices.triton_kernels_for_the_run()  # before the adapter is imported
    impl = load(impl_spec, require)
    if impl is None:
        return 2
    found, described = announce(impl, profile, triton_kernels)
    pytest_exit_code, signalled = run_properties(impl, profile, report_dir, workers or "auto", extra_pytest_args)
    if signalled:
        print(f"mla-fuse verify: stopped by {signalled} before the properties ended: no verdict, no report.json "
              "(exit 2)", file=sys.stderr)
        return 2
    phases = {"properties": round(time.monotonic() - started, 1)}
    outcomes = summary.read_outcomes(report_dir / OUTCOMES_FILE)
    summaries = summary.summarize(outcomes, impl.spec)
    phase = maps.MapPhase(maps.to_map(outcomes), map_rounds, map_seconds, bool(maps.declared_limits(impl)))
    ran = PropertiesRan(impl, profile, found, described, command_line(), os.getcwd(), started_at, started,
                        seed_policy(profile), pytest_exit_code, outcomes, summaries, known)
    report, written, signalled = map_failures(ran, phase, phases, report_dir)
    console.print_report(impl, profile, time.monotonic() - started, summaries, outcomes, report, phase)
    if signalled:
        print(f"mla-fuse verify: stopped by {signalled}: no reproducers written")
    else:
        report, written = add_reproducers(report_dir, report)
    finish(report_dir, report, written, ran, write_known)
    return report["run"]["exit_code"]


def load(impl_spec: str | None, require: tuple[str, ...]):
    """The implementation, or None (its error printed) when it does not load."""
    try:
        return load_implementation(impl_spec, require)
    except ImplementationError as error:
        print(f"mla-fuse verify: {error}", file=sys.stderr)
        return None


def announce(impl, profile: str, triton_kernels: str) -> tuple[dict, dict]:
    """Print what runs; report.json's ``environment`` and ``implementation``."""
    header = console.describe_implementation(impl)
    found, described = environment.environment(), environment.implementation(impl, header)
    found["adapter_triton_kernels"] = triton_kernels
    console.print_what_ran(impl, profile, found, described["version"], header)
    return found, described


def run_properties(impl, profile: str, report_dir: pathlib.Path, workers: str,
                   extra_pytest_args: list[str]) -> tuple[int | None, str | None]:
    """The property suite in a pytest child, its command line printed first as it runs (its environment as a
    pasteable prefix): its exit status, and the signal that stopped it, if one did (``stopping.run_child``)."""
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / OUTCOMES_FILE).unlink(missing_ok=True)
    command = pytest_command(impl.spec, profile, report_dir, workers, impl.required, extra_pytest_args)
    env = dict(os.environ, MLA_FUSE_REPORT_DIR=str(report_dir),
               PYTHONPATH=os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]))
    shown = {name: str(pathlib.Path(env[name]).absolute()) if name == "MLA_FUSE_REPORT_DIR" else env[name]
             for name in ("PYTHONPATH", "MLA_FUSE_REPORT_DIR")}
    prefix = " ".join(f"{name}={shlex.quote(value)}" for name, value in shown.items())
    return stopping.run_child(command, env, lambda: print(f"$ {prefix} {shlex.join(command)}", flush=True))


def map_failures(ran: PropertiesRan, phase: maps.MapPhase, phases: dict,
                 report_dir: pathlib.Path) -> tuple[dict, list[pathlib.Path], str | None]:
    """Publish the properties' verdict, map the failing properties and check the declared limits into
    ``phase`` (the report published after each map), then publish the report as the map left it. Returns
    that report, the views written and the signal that stopped the map (None: it was not stopped)."""
    failed = ran.failed
    with stopping.Handled() as handled:  # a second signal while the last report is written is not obeyed
        publish(report_dir, report_of(ran, phase, phases, failed))  # the properties' verdict, before the map
        if phase.running:
            print(f"mla-fuse verify: the properties' verdict ({'FAIL' if failed else 'PASS'}) is in "
                  f"{report_dir / 'report.json'}, rewritten as each map finishes; mapping {len(phase.properties)} "
                  f"failing properties, for at most {phase.seconds:g} s", flush=True)
            try:
                maps.run_maps(ran.impl, ran.outcomes, ran.profile, phase, phases, ran.known.cells if ran.known else (),
                              on_map=lambda: publish(report_dir, report_of(ran, phase, phases, failed)),
                              check=handled.raise_if_signalled)
            except stopping.Stopped as stop:
                phase.stopped = stop.name
        phase.running = False
        failed = failed or any(check.finding for check in phase.limits)  # unguarded, no caller's guard: a finding
        report = report_of(ran, phase, phases, failed)
        written = publish(report_dir, report, os.environ.get("GITHUB_STEP_SUMMARY") if handled.signal else None)
    return report, written, handled.signal


def report_of(ran: PropertiesRan, phase: maps.MapPhase, phases: dict, failed: bool) -> dict:
    """report.json as things stand: the properties' outcomes, the maps and limits so far, judged
    against the known failures (which can make the exit status 0)."""
    run = {"command": ran.command, "cwd": ran.cwd, "started": ran.started_at.isoformat(timespec="seconds"),
           "seconds": round(time.monotonic() - ran.started, 1), "profile": ran.profile,
           "seed_policy": ran.seed_policy, "phases": dict(phases), "pytest_exit_code": ran.pytest_exit_code,
           "exit_code": 1 if failed else 0, "map": phase.as_json()}
    deployments = document.deployments(ran.outcomes, phase.maps)
    coverage = document.coverage(ran.outcomes, ran.impl, deployments)
    report = document.report(run, ran.environment, ran.implementation, summary.as_json(ran.summaries), ran.outcomes,
                             phase.maps, phase.limits, coverage, deployments)
    baseline.judge(report, ran.outcomes, ran.known)
    return report


def publish(report_dir: pathlib.Path, report: dict, step_summary: str | None = None) -> list[pathlib.Path]:
    """Write report.json, then its views (each file replaced whole: a signal leaves the last); the views' paths."""
    document.write(report_dir, report)
    return views.write(report_dir, step_summary)


def add_reproducers(report_dir: pathlib.Path, report: dict) -> tuple[dict, list[pathlib.Path]]:
    """A standalone script per failing cell, run; the report with them, published."""
    report = script.write_reproducers(report_dir, report)
    return report, publish(report_dir, report, os.environ.get("GITHUB_STEP_SUMMARY"))


def finish(report_dir: pathlib.Path, report: dict, written: list[pathlib.Path], ran: PropertiesRan,
           write_known: pathlib.Path | None) -> None:
    """The environment into junit.xml, this run's failing ids into ``write_known``, the closing lines."""
    document.junit_properties(report_dir / "junit.xml", ran.environment, ran.implementation)
    if write_known:
        baseline.write_known_failures(write_known, report)
    console.print_closing(report, report_dir, written)


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


def seed_policy(profile: str) -> str:
    """``derandomized`` (the same examples every run) or ``random, database WHERE``."""
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
