"""The workers of an ``mla-fuse fuzz`` campaign: what each runs (``fuzz_worker``, HypoFuzz's loop,
over the property modules), with which pytest options, environment and device; starting them,
watching them until the deadline or until every property has failed, and stopping them.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

from mla_fuse_conformance.commands.fuzz.records import CampaignWindow, read_campaign, total_inputs
from mla_fuse_conformance.commands.progress import Progress, elapsed
from mla_fuse_conformance.commands.fuzz.worker import ALL_FAILED, STOP_SIGNAL  # its line when it ends on its own
from mla_fuse_conformance.declarations.property_modules import (COMPILE_PASS_MODULES, EXPLICIT_ONLY_MODULES,
                                                                 KERNEL_PROPERTY_MODULES,
                                                                 PASSES_IMPLEMENTATION, SUITE_DIR)
from mla_fuse_conformance.settings import database
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import recording

# what a fuzzer can search: the kernel properties but those of fixed explicit examples only
FUZZED_KERNEL_MODULES = tuple(module for module in KERNEL_PROPERTY_MODULES if module not in EXPLICIT_ONLY_MODULES)
WORKER_MODULE = "mla_fuse_conformance.commands.fuzz.worker"  # HypoFuzz's fuzzing loop without its hub
STOP_CHECK_SECONDS = 2.0
STOP_GRACE_SECONDS = 20.0
TARGET_COUNT = re.compile(r"using \d+ process(?:es)? to fuzz (\d+) tests?")  # how many properties a worker fuzzes
LOG_TAIL_LINES = 15  # of a dead worker's log, in the report


# ---------------------------------------------------------------- what the workers run


def suite_files(spec: str) -> list[str]:
    modules = FUZZED_KERNEL_MODULES + (COMPILE_PASS_MODULES if spec == PASSES_IMPLEMENTATION else ())
    return [str(SUITE_DIR / f"{module}.py") for module in modules]


def pytest_options(spec: str, profile: str) -> list[str]:
    """Node ids relative to the suite's directory: the ids HypoFuzz keys the database by
    (``database.key_by_suite_node_id``)."""
    return [f"--rootdir={SUITE_DIR}", "-p", "no:cacheprovider", f"--mla-fuse-impl={spec}",
            f"--hypothesis-profile={profiles.full_name(profile)}"]


def worker_command(spec: str, extra_pytest_args: list[str]) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, *suite_files(spec), *pytest_options(spec, "nightly"),
            *extra_pytest_args]


def worker_environment(options, device: str | None, read_only: bool, inflight: pathlib.Path | None = None,
                       workers: int = 1) -> dict[str, str]:
    """``inflight``: the process's own in-flight file. Two processes sharing one (the default
    ``inflight-main.json`` of every non-xdist pytest run) moved each other's file away, and the
    suite's bookkeeping failed an example that then passed on replay. One of ``workers`` processes
    gets its share of torch's CPU threads as ``OMP_NUM_THREADS`` (``devices.worker_threads``; a
    count the user set is kept), as an xdist worker of the plugin does."""
    from mla_fuse_conformance.running.devices import DEVICE_ENV_VAR, worker_threads  # imports torch: not at start

    env = dict(os.environ)
    threads = worker_threads(workers)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
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
    import torch  # not at start: `mla-fuse fuzz` loads torch only where a worker needs it

    return [f"cuda:{index}" for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def worker_devices(workers: int, gpus: list[str]) -> list[str | None]:
    """Worker i on GPU i (round robin), unless ``$MLA_FUSE_DEVICE`` already chooses, or there is none."""
    from mla_fuse_conformance.running.devices import DEVICE_ENV_VAR  # imports torch: not at start

    if not gpus or os.environ.get(DEVICE_ENV_VAR):
        return [None] * workers
    return [gpus[index % len(gpus)] for index in range(workers)]


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
                                       env=worker_environment(options, device, options.read_only, inflight,
                                                              len(devices)))
        workers.append(Worker(index, device, log, process, inflight))
        print(f"worker {index}: pid {process.pid}, device {device or 'default'}, log {log}", flush=True)
    return workers


def process_tree(workers: list[Worker], known: set[int]) -> set[int]:
    """The pids of the workers and their children (HypoFuzz forks the fuzzing process)."""
    import psutil  # the [fuzz] extra

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


def worker_counts(db, window: CampaignWindow, owned: list[set[int]]) -> list[tuple[int, int]]:
    """Per worker (``owned``: the pids of each worker's processes), the inputs its HypoFuzz loop has
    run in this campaign and the properties it has failed, from HypoFuzz's latest reports."""
    from hypofuzz.database import HypofuzzDatabase  # the [fuzz] extra: `mla-fuse` starts without HypoFuzz
    from hypofuzz.database.database import test_keys_key
    from hypothesis.internal.conjecture.data import Status

    fuzz_db, latest = HypofuzzDatabase(db), {}
    for key in fuzz_db.fetch(test_keys_key):
        for report in fuzz_db.reports.fetch(key):
            seen = latest.get((report.worker_uuid, key))
            if window.started <= report.timestamp <= window.finished and (
                    seen is None or report.elapsed_time > seen.elapsed_time):
                latest[(report.worker_uuid, key)] = report
    counts = [[0, 0] for _ in owned]
    for (uuid, _), report in latest.items():
        identity = fuzz_db.worker_identities.fetch(uuid.encode("ascii"))
        for index, pids in enumerate(owned):
            if identity is not None and identity.hostname == window.host and identity.pid in pids:
                counts[index][0] += total_inputs(report)
                counts[index][1] += bool(report.status_counts[Status.INTERESTING])
    return [(inputs, failed) for inputs, failed in counts]


def campaign_line(counts: list[tuple[int, int]], seconds: float) -> str:
    return f"fuzzing {elapsed(seconds)}: " + "; ".join(
        f"worker {index}: {inputs} inputs, {failed} propert{'y' if failed == 1 else 'ies'} failed"
        for index, (inputs, failed) in enumerate(counts))


def wait_for(workers: list[Worker], deadline: float, db, started: float) -> set[int]:
    """Wait until the deadline, the end of every worker, or every property failed (Ctrl-C: now);
    return the pids of the campaign's processes. "Every property failed" must hold at two checks
    in a row: HypoFuzz writes the shrunk failure in the background just after its report. Every
    30 s, each worker's inputs and failed properties so far."""
    pids: set[int] = set()
    owned: list[set[int]] = [set() for _ in workers]
    shown = Progress(lambda text: print(text, end="", flush=True), tty=False, last=time.monotonic())
    failed_checks = 0
    try:
        while time.monotonic() < deadline and any(w.process.poll() is None for w in workers):
            time.sleep(STOP_CHECK_SECONDS)
            pids = process_tree(workers, pids)
            for worker, found in zip(workers, owned):
                found |= process_tree([worker], found)
            if shown.due():
                window = CampaignWindow(started, time.time(), socket.gethostname(), frozenset(pids))
                shown.update(campaign_line(worker_counts(db, window, owned), time.time() - started))
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
    """``STOP_SIGNAL`` to each worker (it ends at once, quietly: ``fuzz_worker.stop_now``), then
    SIGKILL what is left of its group (its children, a worker stuck in a kernel)."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.stopped = True
            worker.process.send_signal(STOP_SIGNAL)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        signal_group(worker, signal.SIGKILL)
        worker.process.wait()
