"""Replay a saved failure exactly, without a hypothesis search.

    mla-fuse repro .mla_fuse_failures/FILE.json [--impl SPEC] [--device DEVICE]

The file (written when a property fails, a worker crashes, or the conformance map finds a
failing cell) names the property, the implementation, the device and the case; the case's seed
rebuilds every tensor bit for bit. ``--impl`` replays the same case against another
implementation (say, ``reference``, to see the case is valid). The file also records the
directories an outside adapter is imported from (``pythonpath``: the adapter's own directory and
the run's ``PYTHONPATH``), so the command replays it from any directory.

The example runs in a child process (``executor.Executor``), so a case that crashes the kernel is
reported as reproduced instead of taking this command down. Exit status: 0 the case passed,
1 the failure reproduced (the recorded kind: a wrong result, the same exception type from the kernel,
a crash by the same signal, a hang: ``same_failure``), 3 it failed another way ("did not reproduce:
recorded X, this run Y": a different failure confirms nothing), 2 the case could not be run
(unreadable file, implementation not importable, operation not provided, case outside the
implementation's declared limits). A file of a limit check's unguarded case (``limit``: the
declared limit it lies outside) runs the case as it is, outside the limits; a refusal then passes.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch
from hypothesis.errors import UnsatisfiedAssumption

from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.running import devices, recording
from mla_fuse_conformance.running.executor import ChildNotProvided, Crashed, Executor, RaisedInChild
from mla_fuse_conformance.running.harness import property_named
from mla_fuse_conformance.contract.implementation import ImplementationError, load_implementation

PASSED, REPRODUCED, COULD_NOT_RUN, OTHER_FAILURE = 0, 1, 2, 3


def failure_class(kind: str) -> str:
    """What must recur for a replay to reproduce a failure of ``kind``: ``wrong result``, ``raised TYPE``,
    ``crashed (SIGNAL)``; any crash for a worker that died with no signal named (``crashed``, ``crashed after
    it finished``); any hang; any failure for one that did not reproduce when recorded."""
    kind = kind.split(", not the same on replay")[0]
    if kind.startswith("did not reproduce") or kind in ("", "failed"):
        return "any failure"
    if kind.startswith("hung"):
        return "hung"
    if kind == "crashed" or kind.startswith("crashed after"):
        return "crashed"
    return kind


def same_failure(recorded: str, now: str) -> bool:
    """Whether a replay that failed as ``now`` (``recording.failure_kind``) reproduces the ``recorded`` kind."""
    wanted = failure_class(recorded)
    return wanted == "any failure" or failure_class(now) == wanted or (
        wanted in ("hung", "crashed") and failure_class(now).startswith(wanted))


def load(path: str) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def _device(record: dict, device: str | None) -> str:
    if device is not None:
        return device
    recorded = record.get("device", "cpu")
    return "cpu" if recorded.startswith("cuda") and not torch.cuda.is_available() else recorded


def add_import_path(record: dict) -> None:
    """Put the directories the record names first on ``sys.path``: the adapter imports here and in
    the executor's children (the fork server starts with this ``sys.path``)."""
    for entry in reversed(record.get("pythonpath") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)


def replay(record: dict, impl_spec: str | None = None, device: str | None = None) -> int:
    """Replay one failure record; the exit status of the module docstring."""
    if record.get("pass_mutant"):  # a compile-pass failure found with a planted pass bug: plant it again
        os.environ["MLA_FUSE_PASS_MUTANT"] = record["pass_mutant"]  # (test_compile_passes reads it at import)
    add_import_path(record)
    try:
        prop = property_named(record["property"])
        impl = load_implementation(impl_spec or record["impl"])
        case = case_types.from_jsonable(record["case"])
    except (ImplementationError, KeyError, TypeError, ValueError) as error:
        hint = ("" if record.get("pythonpath") or "cannot import module" not in str(error) else
                " (the file names no directory to import it from: run this from the adapter's directory, "
                "or put that directory on PYTHONPATH)")
        print(f"could not run: {error}{hint}", file=sys.stderr)
        return COULD_NOT_RUN
    device = _device(record, device)
    if record.get("pass_mutant"):
        print(f"pass mutant planted: {record['pass_mutant']}")
    print(f"property: {prop.name}\nimplementation: {impl.spec}\ndevice: {device}\n"
          f"recorded: {record.get('kind', 'failed')}\ncase: {case!r}", flush=True)
    outside = record.get("limit")  # a case just outside a declared limit (a limit check's unguarded case)
    if outside:
        print(f"outside the declared limit {outside}: run as it is (a refusal passes)")
    served = record.get("served")  # a deployment of an engine layout the implementation serves
    if served:
        print(f"a deployment of {served}, which the implementation serves: run as the engine calls it")
    with Executor(impl.spec, device, impl.required) as executor:
        try:
            executor.run(prop.name, case, within_limits=not outside, served=served)
        except (AssertionError, RaisedInChild, Crashed) as error:
            if outside and getattr(error, "original_type", None) == "Refused":
                print(f"refused: {error}\nPASSED", flush=True)
                return PASSED
            now = recording.failure_kind(error)
            if not same_failure(record.get("kind", ""), now):
                print(f"{error}\ndid not reproduce: recorded {record.get('kind')}, this run {now}", flush=True)
                return OTHER_FAILURE
            print(f"{error}\nREPRODUCED", flush=True)
            return REPRODUCED
        except (ChildNotProvided, UnsatisfiedAssumption) as reason:
            print(f"could not run: {reason or 'the case is outside the implementation declared limits'}",
                  file=sys.stderr)
            return COULD_NOT_RUN
    print("PASSED")
    return PASSED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mla-fuse repro", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a failure file from .mla_fuse_failures/")
    parser.add_argument("--impl", help="replay against this implementation instead of the recorded one")
    parser.add_argument("--device", help="replay on this device instead of the recorded one")
    options = parser.parse_args(argv)
    devices.triton_kernels_for_the_run()  # as the run did, before the adapter is imported
    try:
        record = load(options.file)
    except (OSError, ValueError) as error:
        print(f"could not run: cannot read {options.file}: {error}", file=sys.stderr)
        return COULD_NOT_RUN
    return replay(record, options.impl, options.device)


if __name__ == "__main__":
    sys.exit(main())
