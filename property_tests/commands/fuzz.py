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
3. Stop: after M minutes (SIGINT to each worker's process group), or as soon as HypoFuzz's own
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

Every worker fuzzes until the end: a worker that ends before it is stopped, other than by
every property failing, died, and is reported with the end of its log (each worker keeps its
log, ``DIR/worker-i.log``) as the campaign's failure to run.

Exit status (``EXIT_*``): 0 nothing failed; 1 a failure the replay pass reproduced (its replay
file is named); 2 bad arguments; 3 the campaign could not run (a worker died or ended on its
own, no property ran an input, the replay pass did not run); 4 a failure a worker hit that did
not reproduce on replay (reported with both outcomes, never as a plain FAIL) and nothing else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

from mla_fuse_conformance.settings import database
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import recording

SUITE_DIR = pathlib.Path(__file__).resolve().parent.parent / "properties"  # the property modules: pytest's rootdir
KERNEL_PROPERTY_MODULES = ("test_rotary_embedding", "test_mla", "test_flash")
COMPILE_PASS_MODULES = ("test_compile_passes",)
PASSES_IMPLEMENTATION = "triton"
WORKER_MODULE = "mla_fuse_conformance.commands.fuzz_worker"  # HypoFuzz's fuzzing loop without its hub
STOP_CHECK_SECONDS = 2.0
STOP_GRACE_SECONDS = 20.0
REPLAY_TIMEOUT_SECONDS = 900
ALL_FAILED = "Found a failing input for every test!"  # what a worker prints when it stops on its own
TARGET_COUNT = re.compile(r"using \d+ process(?:es)? to fuzz (\d+) tests?")  # and how many it fuzzes
DEFAULT_OUT = pathlib.Path(".mla_fuse_reports") / "fuzz"
EXIT_PASSED, EXIT_FAILED, EXIT_BAD_ARGUMENTS, EXIT_COULD_NOT_RUN, EXIT_DID_NOT_REPLAY = 0, 1, 2, 3, 4
LOG_TAIL_LINES = 15  # of a dead worker's log, in the report


# ---------------------------------------------------------------- what the workers run


def suite_files(spec: str) -> list[str]:
    modules = KERNEL_PROPERTY_MODULES + (COMPILE_PASS_MODULES if spec == PASSES_IMPLEMENTATION else ())
    return [str(SUITE_DIR / f"{module}.py") for module in modules]


def pytest_options(spec: str, profile: str) -> list[str]:
    """Node ids relative to the suite's directory: the ids HypoFuzz keys the database by
    (``database.key_by_suite_node_id``)."""
    return [f"--rootdir={SUITE_DIR}", "-p", "no:cacheprovider", f"--mla-fuse-impl={spec}",
            f"--hypothesis-profile={profiles.full_name(profile)}"]


def worker_command(spec: str, extra_pytest_args: list[str]) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, *suite_files(spec), *pytest_options(spec, "nightly"),
            *extra_pytest_args]


def worker_environment(options, device: str | None, read_only: bool, inflight: pathlib.Path | None = None) -> dict[str, str]:
    """``inflight``: the process's own in-flight file. Two processes sharing one (the default
    ``inflight-main.json`` of every non-xdist pytest run) moved each other's file away, and the
    suite's bookkeeping failed an example that then passed on replay."""
    from mla_fuse_conformance.running.devices import DEVICE_ENV_VAR  # imports torch: not at `mla-fuse` start

    env = dict(os.environ)
    if inflight is not None:
        env[recording.INFLIGHT_ENV] = str(inflight)
    env[database.DATABASE_ENV_VAR] = options.db or str(database.default_directory())
    env.pop(database.READ_ONLY_ENV_VAR, None)
    if read_only:
        env[database.READ_ONLY_ENV_VAR] = "1"
    if device is not None:
        env[DEVICE_ENV_VAR] = device
    return env


def cuda_devices() -> list[str]:
    import torch

    return [f"cuda:{index}" for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def worker_devices(workers: int, gpus: list[str]) -> list[str | None]:
    """Worker i on GPU i (round robin), unless ``$MLA_FUSE_DEVICE`` already chooses, or there is none."""
    from mla_fuse_conformance.running.devices import DEVICE_ENV_VAR

    if not gpus or os.environ.get(DEVICE_ENV_VAR):
        return [None] * workers
    return [gpus[index % len(gpus)] for index in range(workers)]


# ---------------------------------------------------------------- what HypoFuzz recorded


@dataclasses.dataclass
class PropertySummary:
    nodeid: str
    database_key: str  # hex: hypothesis keeps the property's failures under it (and HypoFuzz under key + suffixes)
    inputs: int = 0  # inputs run by this campaign's workers, all together
    behaviors: int = 0  # HypoFuzz behaviours covered (branches + events), best worker
    fingerprints: int = 0  # distinct sets of behaviours, best worker
    first_failure_at: list[int] = dataclasses.field(default_factory=list)  # per failing worker
    shrunk: bool = False  # a worker has finished shrinking its failure (HypoFuzz's "failed" phase)
    failures: list[str] = dataclasses.field(default_factory=list)  # stored in the database
    skipped: str | None = None
    replay: str | None = None  # outcome of the replay pass: passed, failed, skipped, "not run", or None (not replayed)
    replay_files: list[str] = dataclasses.field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``FAIL``: the replay pass reproduced a failure; ``did not replay``: a worker failed on it but
        the replay of what it stored passed (or nothing was stored to replay); else ``skipped``,
        ``pass`` or ``not run``."""
        if self.replay == "failed":
            return "FAIL"
        if self.first_failure_at or self.failures:
            return "did not replay"
        if self.skipped:
            return "skipped"
        return "pass" if self.inputs else "not run"


def total_inputs(report) -> int:
    return sum(report.status_counts.values())


def inputs_to_first_failure(reports) -> int | None:
    """The inputs one worker had run when it first failed (HypoFuzz reports at the failure)."""
    from hypothesis.internal.conjecture.data import Status

    for report in sorted(reports, key=lambda r: r.elapsed_time):
        if report.status_counts[Status.INTERESTING]:
            return total_inputs(report)
    return None


def failure_message(observation, lines: int = 2) -> str:
    """The error's first lines (pytest's ``E`` lines of the traceback), else the exception line of a
    plain traceback, else HypoFuzz's reason; never empty."""
    traceback = (observation.metadata.traceback or "").splitlines()
    error = [line[1:].strip() for line in traceback if line.startswith("E ")]
    if not error:
        error = [line.strip() for line in traceback if line.strip() and not line.startswith((" ", "Traceback"))][-1:]
    return " ".join(error[:lines]) or observation.status_reason or "(HypoFuzz stored no error text)"


def is_skip(observation) -> bool:
    return observation.status_reason.startswith("Skipped ")


def stored_failures(fuzz_db, key: bytes) -> list:
    """Observations of the failures stored for ``key``: shrunk ones, else those still unshrunk."""
    from hypofuzz.database import FailureState

    for state in (FailureState.SHRUNK, FailureState.UNSHRUNK):
        found = [fuzz_db.failure_observations(state=state).fetch(key, choices)
                 for choices in fuzz_db.failures(state=state).fetch(key)]
        found = [observation for observation in found if observation is not None]
        if found:
            return found
    return []


@dataclasses.dataclass(frozen=True)
class CampaignWindow:
    started: float  # time.time()
    finished: float
    host: str
    pids: frozenset[int]


def campaign_workers(fuzz_db, uuids: set[str], window: CampaignWindow) -> set[str]:
    """The HypoFuzz worker uuids that ran on this host in one of this campaign's processes."""
    ours = set()
    for uuid in uuids:
        identity = fuzz_db.worker_identities.fetch(uuid.encode("ascii"))
        if identity is not None and identity.hostname == window.host and (
                not window.pids or identity.pid in window.pids):
            ours.add(uuid)
    return ours


def summarize_key(fuzz_db, key: bytes, reports: list, ours: set[str]) -> PropertySummary:
    from hypofuzz.database import Phase

    by_worker: dict[str, list] = {}
    for report in reports:
        if report.worker_uuid in ours:
            by_worker.setdefault(report.worker_uuid, []).append(report)
    summary = PropertySummary(reports[0].nodeid, key.hex())
    for worker_reports in by_worker.values():
        latest = max(worker_reports, key=lambda r: r.elapsed_time)
        summary.inputs += total_inputs(latest)
        summary.behaviors = max(summary.behaviors, latest.behaviors)
        summary.fingerprints = max(summary.fingerprints, latest.fingerprints)
        first = inputs_to_first_failure(worker_reports)
        if first is not None:
            summary.first_failure_at.append(first)
        summary.shrunk |= any(report.phase is Phase.FAILED for report in worker_reports)
    for observation in stored_failures(fuzz_db, key):
        if is_skip(observation):
            summary.skipped = failure_message(observation)
        else:
            summary.failures.append(failure_message(observation))
    if summary.skipped and not summary.failures:  # HypoFuzz stores a skip as a failure; it is not one
        summary.first_failure_at.clear()
        summary.shrunk = False
    return summary


def read_campaign(db, window: CampaignWindow) -> dict[str, PropertySummary]:
    """One summary per property this campaign's workers ran, from HypoFuzz's database entries."""
    from hypofuzz.database import HypofuzzDatabase
    from hypofuzz.database.database import test_keys_key

    fuzz_db = HypofuzzDatabase(db)
    recent = {}
    for key in fuzz_db.fetch(test_keys_key):
        reports = [r for r in fuzz_db.reports.fetch(key) if window.started <= r.timestamp <= window.finished]
        if reports:
            recent[key] = reports
    ours = campaign_workers(fuzz_db, {r.worker_uuid for reports in recent.values() for r in reports}, window)
    summaries = {}
    for key, reports in recent.items():
        if any(report.worker_uuid in ours for report in reports):
            summary = summarize_key(fuzz_db, key, reports, ours)
            summaries[summary.nodeid] = summary
    return summaries


# ---------------------------------------------------------------- running and stopping the workers


@dataclasses.dataclass
class Worker:
    """One worker process (``fuzz_worker``: HypoFuzz's fuzzing loop). It ends on its own only when
    every property it fuzzes has failed; any other end before this command stops it is its death."""

    index: int
    device: str | None
    log: pathlib.Path
    process: subprocess.Popen
    inflight: pathlib.Path | None = None
    stopped: bool = False  # by this command (deadline, every property failed, Ctrl-C)
    reported: bool = False  # its death has been announced

    def finished_by_itself(self) -> bool:
        """HypoFuzz's loop stops on its own only when every property it fuzzes has failed."""
        return self.process.returncode == 0 and ALL_FAILED in self.log.read_text(errors="replace")

    def died(self) -> bool:
        return self.process.poll() is not None and not self.stopped and not self.finished_by_itself()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log.read_text(errors="replace").rstrip().splitlines()
        return "\n".join(f"    | {line}" for line in text[-lines:])


def start_workers(options, devices: list[str | None], out_dir: pathlib.Path) -> list[Worker]:
    workers = []
    for index, device in enumerate(devices):
        log = out_dir / f"worker-{index}.log"
        inflight = out_dir / f"worker-{index}.inflight.json"
        with open(log, "w") as stream:
            process = subprocess.Popen(worker_command(options.spec, options.pytest_args), stdout=stream,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       env=worker_environment(options, device, options.read_only, inflight))
        workers.append(Worker(index, device, log, process, inflight))
        print(f"worker {index}: pid {process.pid}, device {device or 'default'}, log {log}", flush=True)
    return workers


def process_tree(workers: list[Worker], known: set[int]) -> set[int]:
    """The pids of the workers and their children (HypoFuzz forks the fuzzing process)."""
    import psutil

    pids = set(known)
    for worker in workers:
        try:
            parent = psutil.Process(worker.process.pid)
            pids |= {parent.pid, *(child.pid for child in parent.children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    return pids


def fuzz_target_count(worker: Worker) -> int | None:
    match = TARGET_COUNT.search(worker.log.read_text(errors="replace"))
    return int(match.group(1)) if match else None


def every_property_failed(workers: list[Worker], db, window: CampaignWindow) -> bool:
    """HypoFuzz's stopping rule: each property it fuzzes has a failure, found and shrunk."""
    counts = [fuzz_target_count(worker) for worker in workers]
    if None in counts:
        return False
    shrunk = [summary for summary in read_campaign(db, window).values() if summary.shrunk]
    return len(shrunk) >= max(counts)


def wait_for(workers: list[Worker], deadline: float, db, started: float) -> set[int]:
    """Wait until the deadline, the end of every worker, or every property failed (Ctrl-C: now);
    return the pids of the campaign's processes. "Every property failed" must hold at two checks
    in a row: HypoFuzz writes the shrunk failure in the background just after its report."""
    pids: set[int] = set()
    failed_checks = 0
    try:
        while time.monotonic() < deadline and any(w.process.poll() is None for w in workers):
            time.sleep(STOP_CHECK_SECONDS)
            pids = process_tree(workers, pids)
            for worker in workers:
                if worker.died() and not worker.reported:
                    worker.reported = True
                    print(f"worker {worker.index} died (exit status {worker.process.returncode}): see {worker.log}",
                          flush=True)
            window = CampaignWindow(started, time.time(), socket.gethostname(), frozenset(pids))
            failed_checks = failed_checks + 1 if every_property_failed(workers, db, window) else 0
            if failed_checks == 2:
                print("every property has failed: stopping the workers", flush=True)
                break
    except KeyboardInterrupt:
        print("interrupted: stopping the workers", flush=True)
    return process_tree(workers, pids)


def signal_group(worker: Worker, signum: int) -> None:
    try:
        os.killpg(worker.process.pid, signum)  # the group of the session the worker started
    except ProcessLookupError:
        pass


def stop(workers: list[Worker]) -> None:
    """SIGINT (HypoFuzz shuts its fuzzing process down), then SIGKILL what is left of each group."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.stopped = True
            signal_group(worker, signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        signal_group(worker, signal.SIGKILL)
        worker.process.wait()


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


# ---------------------------------------------------------------- the report


def format_table(summaries: dict[str, PropertySummary]) -> str:
    header = ("property", "inputs", "behaviours", "fingerprints", "first failure at input", "verdict")
    rows = [header] + [(s.nodeid, str(s.inputs), str(s.behaviors), str(s.fingerprints),
                        ", ".join(map(str, s.first_failure_at)) or "-", s.verdict)
                       for s in sorted(summaries.values(), key=lambda s: s.nodeid)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def pytest_replay_command(nodeid: str, options) -> str:
    """A developer's run of one property that replays what the database holds for it (and nothing else)."""
    test = nodeid.partition("::")[2].partition("[")[0]
    return (f"{database.DATABASE_ENV_VAR}={shlex.quote(database.shown(options.db))} python -m pytest --pyargs "
            f"mla_fuse_conformance --mla-fuse-impl={shlex.quote(options.spec)} -k {shlex.quote(test)} "
            f"--hypothesis-profile={profiles.full_name('replay')}")


def describe_failures(summaries: dict[str, PropertySummary], options) -> list[str]:
    lines = []
    for summary in sorted(summaries.values(), key=lambda s: s.nodeid):
        if summary.verdict == "FAIL":
            lines.append(f"\nFAILED {summary.nodeid} (replay pass: {summary.replay})")
            lines += [f"  {message}" for message in summary.failures]
            if not summary.replay_files:
                lines.append("  (the replay pass wrote no replay file: see its log)")
            lines += [f"  replay exactly: {recording.replay_command(pathlib.Path(path))}" for path in summary.replay_files]
            lines.append(f"  or with pytest: {pytest_replay_command(summary.nodeid, options)}")
        elif summary.verdict == "did not replay":
            first = ", ".join(map(str, summary.first_failure_at)) or "-"
            lines.append(f"\nDID NOT REPLAY {summary.nodeid}: not a failure this campaign can show")
            lines.append(f"  in the campaign: failed (first failure at input {first}): "
                         f"{'; '.join(summary.failures) or 'nothing stored for it in the database'}")
            lines.append(f"  on replay: {summary.replay or 'nothing to replay'} (the stored example, replayed by pytest "
                         f"outside HypoFuzz; a failure that depends on what ran before it in the worker)")
            lines.append(f"  try it: {pytest_replay_command(summary.nodeid, options)}")
    return lines


def campaign_errors(workers: list[Worker], summaries: dict[str, PropertySummary]) -> list[str]:
    """Why the campaign could not run as asked: a worker that died or ended on its own, no input."""
    errors = []
    for w in workers:
        if w.died():
            errors.append(f"worker {w.index} did not fuzz until the end: it died (exit status {w.process.returncode}); "
                          f"log {w.log}, which ends:\n{w.log_tail()}")
    if not any(summary.inputs for summary in summaries.values()):
        errors.append("no property ran an input: see the worker logs")
    return errors


def exit_status(summaries: dict[str, PropertySummary], errors: list[str]) -> int:
    verdicts = {summary.verdict for summary in summaries.values()}
    if "FAIL" in verdicts:
        return EXIT_FAILED
    if errors:
        return EXIT_COULD_NOT_RUN
    return EXIT_DID_NOT_REPLAY if "did not replay" in verdicts else EXIT_PASSED


VERDICT_LINES = {EXIT_PASSED: "PASS", EXIT_FAILED: "FAIL", EXIT_COULD_NOT_RUN: "COULD NOT RUN",
                 EXIT_DID_NOT_REPLAY: "DID NOT REPLAY"}


def write_report(options, workers, summaries, errors, seconds: float, out_dir: pathlib.Path) -> int:
    """Print the report, write ``summary.json``; return the exit status."""
    status = exit_status(summaries, errors)
    passed = status == EXIT_PASSED
    collected = max((fuzz_target_count(worker) or 0 for worker in workers), default=0)
    report = {
        "implementation": options.spec, "database": database.shown(options.db), "read_only": options.read_only,
        "minutes": options.minutes, "seconds": round(seconds, 1), "passed": passed, "errors": errors,
        "collected": collected, "exit_status": status, "verdict": VERDICT_LINES[status],
        "workers": [{"device": w.device, "log": str(w.log), "exit_status": w.process.returncode,
                     "stopped_by_mla_fuse": w.stopped, "died": w.died()} for w in workers],
        "properties": {nodeid: {**dataclasses.asdict(s), "verdict": s.verdict} for nodeid, s in summaries.items()},
    }
    (out_dir / "summary.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"\nmla_fuse fuzz: {options.spec}, {len(workers)} worker(s), database {database.shown(options.db)}"
          f"{' (read-only)' if options.read_only else ''}, {seconds / 60:.1f} min: HypoFuzz started "
          f"{len(summaries)} of the {collected} properties it collected (it picks by rate of new "
          f"behaviour)\n{format_table(summaries)}")
    print("\n".join(describe_failures(summaries, options) + [f"\nerror: {error}" for error in errors]))
    print(f"\nsummary: {out_dir / 'summary.json'}\nverdict: {VERDICT_LINES[status]} (exit status {status})")
    return status


# ---------------------------------------------------------------- the command


def check_options(options) -> None:
    """Bad arguments: a ValueError naming the option, before anything starts."""
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
          f"{database.shown(options.db)}{' (read-only)' if options.read_only else ''}", flush=True)
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
        from mla_fuse_conformance.contract.implementation import resolve_spec

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
