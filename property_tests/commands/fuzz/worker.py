"""One ``mla-fuse fuzz`` worker: HypoFuzz's fuzzing loop (``hypofuzz.hypofuzz.FuzzWorker``) in this
process, without HypoFuzz's hub.

    python -m mla_fuse_conformance.commands.fuzz.worker PYTEST_ARGS...

``hypothesis fuzz -n 1`` runs a hub that forks a ``Manager`` and one fuzzing process, and every
60 s ends the campaign if no worker has a property left to fuzz. HypoFuzz 25.11.1's hub reads
that from a list each fuzzing process fills only after its first 100 inputs; when those take
longer than a minute (the Triton interpreter, Inductor compiles, a loaded machine), the hub
printed "Found a failing input for every test!" with nothing failed, shut its ``Manager`` down,
and the fuzzing process died at its next report (or the campaign ended early). With one process
per worker the hub has nothing to balance, so the worker runs HypoFuzz's own loop here, with the
same arguments, the same collection, scheduling, mutation, shrinking and database writes; the
hub's state is a plain dict. The worker ends (status 0) only when every property it fuzzes has
failed (or was skipped), after it says so with HypoFuzz's line; ``mla-fuse fuzz`` stops it
otherwise (``STOP_SIGNAL``: it ends at once, status 0, with the line ``STOPPED``). Any other end is
the death of the worker.
"""

from __future__ import annotations

import os
import signal
import sys

ALL_FAILED = "Found a failing input for every test!"  # HypoFuzz's line, which ``mla-fuse fuzz`` reads
STOP_SIGNAL = signal.SIGTERM  # what ``mla-fuse fuzz`` sends a worker at the end of the campaign
STOPPED = "stopped by mla-fuse fuzz"


def stop_now(signum, frame) -> None:
    """End the worker at once and quietly. Not by unwinding: hypothesis reads a SystemExit raised in
    a test as the test's failure, and a KeyboardInterrupt (SIGINT) unwound through HypoFuzz's loop
    into a traceback at the end of every passing campaign's log. Nothing is lost: hypothesis writes a
    directory entry by renaming a whole file and a Redis entry in one command."""
    print(STOPPED, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)


class WorkerState(dict):
    """HypoFuzz's per-worker state, which its fuzzing loop updates after each batch of inputs; the
    loop ends when no property is left to fuzz (the hub's rule, read when it is true)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "valid_nodeids" and not value:
            print(ALL_FAILED, file=sys.stderr, flush=True)
            raise SystemExit(0)


def main(pytest_args: list[str]) -> int:
    from hypofuzz import detection  # the [fuzz] extra: `mla-fuse` starts without HypoFuzz
    from hypofuzz.collection import collect_tests
    from hypofuzz.hypofuzz import FuzzWorker

    signal.signal(STOP_SIGNAL, stop_now)
    detection._in_hypofuzz_run = True
    print("collecting tests... ", end="", flush=True)
    nodeids = [target.nodeid for target in collect_tests(pytest_args).fuzz_targets]
    print("done")
    if not nodeids:
        print(f"No property-based tests were collected. pytest args: {pytest_args}", flush=True)
        return 4
    print(f"using 1 process to fuzz {len(nodeids)} tests", flush=True)
    state = {"hub_state": {"nodeids": nodeids},
             "worker_state": WorkerState(nodeids={}, current_lifetime=0.0, expected_lifetime=0.0, valid_nodeids=[None])}
    FuzzWorker(pytest_args=pytest_args, shared_state=state).start()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
