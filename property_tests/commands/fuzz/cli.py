"""``mla-fuse fuzz``: the property suite as a HypoFuzz campaign on N local workers, against one
example database that other runners share, for M minutes; then replay files and a summary.

    mla-fuse fuzz --impl SPEC [--workers N] [--db URL] [--minutes M] [--read-only] [--out DIR] [-- PYTEST_ARGS]

1. Workers. Worker i is one process running HypoFuzz's fuzzing loop over the pytest args
   (``fuzz_worker``: what ``hypothesis fuzz -n 1`` runs, without the hub whose one-minute
   check ended slow campaigns; its adaptive schedule over the properties, coverage-guided
   mutation, shrinking). With GPUs there is one worker per GPU by default, worker i on
   ``cuda:i`` through ``$MLA_FUSE_DEVICE``; on the CPU, one. The properties are the kernel
   properties of the three operation modules against ``--impl`` (without the bad-input
   properties unless ``--bad-input``: one target per named corruption, over a hundred, which
   every CI run covers and which would take most of HypoFuzz's schedule) and, for ``triton``
   (the only implementation the compile passes call), the compile-pass properties; pytest
   arguments after ``--`` narrow them (``-- -k fused``). HypoFuzz runs under the ``mla_fuse.nightly``
   profile (random, with the database); sizes follow ``$MLA_FUSE_PROPERTY_SIZES``.
2. The database. Each worker opens ``--db`` as every pytest run of the suite does
   (``$MLA_FUSE_HYPOTHESIS_DB``, ``mla_fuse_conformance.settings.database``). When HypoFuzz starts a
   property it first replays every failure stored for it, by any worker of any runner, then
   the stored corpus, then generates. ``--read-only`` reads the shared database and writes only
   to the local directory ``.hypothesis/mla_fuse``.
3. Stop: after M minutes (SIGTERM to each worker, which ends at once and quietly, then SIGKILL to
   what is left of its process group), or as soon as HypoFuzz's own
   stopping rule holds: every property the workers fuzz has failed (a worker sees that only
   after a batch of 100 inputs; this command reads HypoFuzz's reports in the database every
   ``STOP_CHECK_SECONDS`` and stops the workers itself).
4. Replay pass: a plain pytest run of every property with a failure stored in the database,
   under the ``mla_fuse.replay`` profile (stored examples only, nothing generated) with the
   database read-only. The suite's pytest plugin writes each failure's replay file there, the file
   ``mla-fuse repro FILE`` replays; HypoFuzz itself runs no pytest hooks.
5. Summary, from the reports HypoFuzz keeps in the database (this runner's workers since the
   start): inputs run, behaviours (branches and events) and fingerprints covered, after how many
   inputs each worker first failed (1: it replayed a stored failure first), the failures with
   their replay files. Written to ``DIR/summary.json`` (default ``.mla_fuse_reports/fuzz``).

The header names the hypothesis the campaign runs with and the ``fuzz`` extra's hold on it
(``hypothesis_line``): installing the extra moves an environment's hypothesis back.

Every worker fuzzes until the end: a worker that ends before it is stopped, other than by
every property failing, died, and is reported with the end of its log (each worker keeps its
log, ``DIR/worker-i.log``) as the campaign's failure to run.

Exit status (``EXIT_*``): 0 nothing failed; 1 a failure the replay pass reproduced (its replay
file is named); 2 bad arguments, or the ``fuzz`` extra is not installed (one line naming the
missing package and ``pip install "mla_fuse[fuzz]"``); 3 the campaign could not run (a worker died or ended on its
own, no property ran an input, the replay pass did not run); 4 a failure a worker hit that did
not reproduce on replay (reported with both outcomes, never as a plain FAIL) and nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

import hypothesis

# The campaign's parts, by role: the workers, what HypoFuzz recorded, the report. Their public names
# stay importable from this module (tests and scripts import them from mla_fuse_conformance.commands.fuzz.cli).
from mla_fuse_conformance.commands.fuzz.records import (  # noqa: F401
    CampaignWindow, PropertySummary, failure_message, read_campaign,
)
from mla_fuse_conformance.commands.fuzz.report import (  # noqa: F401
    EXIT_BAD_ARGUMENTS, EXIT_COULD_NOT_RUN, EXIT_DID_NOT_REPLAY, EXIT_FAILED, EXIT_PASSED, campaign_errors, exit_status,
    write_report,
)
from mla_fuse_conformance.commands.fuzz.workers import (  # noqa: F401
    SUITE_DIR, WORKER_MODULE, Worker, cuda_devices, pytest_options, start_workers, stop, suite_files, wait_for,
    worker_command, worker_devices, worker_environment,
)
from mla_fuse_conformance.settings import database
from mla_fuse_conformance.running import recording

REPLAY_TIMEOUT_SECONDS = 900
DEFAULT_OUT = pathlib.Path(".mla_fuse_reports") / "fuzz"
FUZZ_EXTRA_PACKAGES = ("hypofuzz", "psutil")  # what a campaign imports beyond the test extra (redis: a Redis --db)
INSTALL_FUZZ_EXTRA = 'pip install "mla_fuse[fuzz]"'
HYPOTHESIS_HELD_BECAUSE = "hypofuzz 25.11 reads ConjectureResult.slice_comments, which hypothesis 6.157.1 renamed"


# ---------------------------------------------------------------- the replay pass


def replay_command(spec: str, nodeids: list[str], junit: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", "pytest", *(f"{SUITE_DIR}/{nodeid}" for nodeid in nodeids),
            *pytest_options(spec, "replay"), f"--junitxml={junit}", "-q"]


def junit_outcomes(junit: pathlib.Path) -> dict[str, str]:
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        nodeid = f"{case.get('classname', '').rpartition('.')[2]}.py::{case.get('name')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[nodeid] = "failed" if failed else "skipped" if case.find("skipped") is not None else "passed"
    return outcomes


def replay_files_since(started: float) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for path in sorted(recording.failure_dir().glob("*.json")):
        if path.stat().st_mtime >= started:
            files.setdefault(json.loads(path.read_text()).get("nodeid", ""), []).append(str(path))
    return files


def replay_stored_failures(options, summaries: dict[str, PropertySummary], out_dir: pathlib.Path) -> list[str]:
    """Run the replay pass over the properties with a stored failure; fill in outcomes and files.
    Return what kept it from running (errors of the campaign)."""
    nodeids = sorted(nodeid for nodeid, summary in summaries.items() if summary.failures)
    if not nodeids:
        return []
    junit = out_dir / "replay.xml"
    junit.unlink(missing_ok=True)
    command = replay_command(options.spec, nodeids, junit)
    print(f"replaying the stored failures of {len(nodeids)} properties (log {out_dir / 'replay.log'})", flush=True)
    started = time.time() - 1.0  # file times have a coarser clock
    errors = []
    with open(out_dir / "replay.log", "w") as log:
        try:
            subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=REPLAY_TIMEOUT_SECONDS,
                           env=worker_environment(options, None, True, out_dir / "replay.inflight.json"))
        except subprocess.TimeoutExpired:
            errors.append(f"the replay pass ran past {REPLAY_TIMEOUT_SECONDS} s: see {out_dir / 'replay.log'}")
    outcomes = junit_outcomes(junit) if junit.exists() else {}
    files = replay_files_since(started)
    for nodeid in nodeids:
        summaries[nodeid].replay = outcomes.get(nodeid, "not run")
        summaries[nodeid].replay_files = files.get(nodeid, [])
        if summaries[nodeid].replay == "not run" and not errors:
            errors.append(f"the replay pass did not run {nodeid}: see {out_dir / 'replay.log'}")
    return errors


# ---------------------------------------------------------------- the command


def missing_fuzz_package() -> str | None:
    """The first package of the ``fuzz`` extra that does not import (or the module it lacks), else None."""
    for package in FUZZ_EXTRA_PACKAGES:
        try:
            importlib.import_module(package)
        except ImportError as error:
            return error.name or package
    return None


def hypothesis_line() -> str:
    """The hypothesis this campaign runs with, and the fuzz extra's hold on it (pyproject.toml, read
    from the installed metadata): installing the extra moves an environment's hypothesis back."""
    try:
        requirements = importlib.metadata.requires("mla_fuse") or []
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        requirements = []
    held = [requirement.partition(";")[0].strip() for requirement in requirements
            if requirement.startswith("hypothesis") and 'extra == "fuzz"' in requirement]
    return (f"hypothesis {hypothesis.__version__}, held by the fuzz extra to {' '.join(held) or 'an older release'} "
            f"({HYPOTHESIS_HELD_BECAUSE}); gate with a newer one from another venv (docs/FUZZING.md)")


def check_options(options) -> None:
    """Bad arguments: a ValueError naming the option, before anything starts."""
    # start-up: `mla-fuse --help` imports this module (docs/STARTUP.md)
    from mla_fuse_conformance.contract.implementation import load_implementation

    if not options.minutes > 0:
        raise ValueError(f"--minutes must be positive, got {options.minutes}")
    if options.workers is not None and options.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {options.workers}")
    if options.read_only and not options.db:
        raise ValueError(f"--read-only needs --db (or ${database.DATABASE_ENV_VAR}): the shared database to read")
    try:
        load_implementation(options.spec)
    except Exception as error:  # noqa: BLE001 - any failure to load is the user's SPEC
        raise ValueError(f"--impl {options.spec!r}: {error}") from None
    database.check_reachable(options.db, "--db")


def run_campaign(options) -> int:
    out_dir = options.out.absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    gpus = cuda_devices()
    devices = worker_devices(options.workers or max(1, len(gpus)), gpus)
    print(f"mla_fuse fuzz: {options.spec} on {len(devices)} worker(s) for {options.minutes} min, database "
          f"{database.shown(options.db)}{' (read-only)' if options.read_only else ''}\n{hypothesis_line()}", flush=True)
    db = database.open_database(options.db, options.read_only, "--db")
    started, clock = time.time(), time.monotonic()
    workers = start_workers(options, devices, out_dir)
    try:
        pids = wait_for(workers, clock + 60.0 * options.minutes, db, started)
    finally:
        stop(workers)
    print(f"workers stopped after {time.monotonic() - clock:.0f} s", flush=True)
    summaries = read_campaign(db, CampaignWindow(started, time.time(), socket.gethostname(), frozenset(pids)))
    errors = replay_stored_failures(options, summaries, out_dir)
    errors = campaign_errors(workers, summaries) + errors
    return write_report(options, workers, summaries, errors, time.monotonic() - clock, out_dir)


def add_fuzz(commands) -> None:
    fuzz = commands.add_parser("fuzz", help="run the property suite as a HypoFuzz campaign (see docs/FUZZING.md)")
    fuzz.add_argument("--impl", dest="spec", default=None, help="SPEC: registered name, mutant:NAME or "
                                                                 "module.path:attr (default: $MLA_FUSE_IMPL, then triton)")
    fuzz.add_argument("--workers", type=int, default=None, help="local worker processes (default: one per GPU, else 1)")
    fuzz.add_argument("--db", default=os.environ.get(database.DATABASE_ENV_VAR),
                      help=f"example database: redis://host:port/db or a directory (default: "
                           f"${database.DATABASE_ENV_VAR}, else {database.DEFAULT_DIRECTORY})")
    fuzz.add_argument("--minutes", type=float, default=10.0, help="stop after this long (default: 10)")
    fuzz.add_argument("--read-only", action="store_true",
                      help="read the database, write only to the local directory .hypothesis/mla_fuse")
    fuzz.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                      help=f"worker logs, replay log and summary.json (default: {DEFAULT_OUT})")
    fuzz.add_argument("--bad-input", action="store_true",
                      help="also fuzz the bad-input properties (one per named corruption: over a hundred targets "
                           "that every CI run already covers; by default left out so the campaign's time goes to "
                           "the properties where search finds bugs)")
    fuzz.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest arguments (-k EXPR, ...)")

    def run(args) -> int:
        # start-up: `mla-fuse --help` imports this module (docs/STARTUP.md)
        from mla_fuse_conformance.contract.implementation import resolve_spec

        missing = missing_fuzz_package()
        if missing is not None:
            print(f"mla-fuse fuzz: needs {missing!r}, which is not installed (the fuzz extra): {INSTALL_FUZZ_EXTRA}")
            return EXIT_BAD_ARGUMENTS
        args.spec = resolve_spec(args.spec)
        args.pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
        if not args.bad_input:  # a later -k of the user's wins (pytest keeps the last)
            args.pytest_args = ["-k", "not rejects_bad_input", *args.pytest_args]
        try:
            check_options(args)
        except (ValueError, RuntimeError) as error:
            print(f"mla-fuse fuzz: {error}")
            return EXIT_BAD_ARGUMENTS
        return run_campaign(args)

    fuzz.set_defaults(run=run)


COMMANDS = (add_fuzz, database.add_db)
