"""Replay a saved failure exactly, without a hypothesis search.

    python -m mla_fuse_conformance.repro .mla_fuse_failures/FILE.json [--impl SPEC] [--device DEVICE]

The file (written by the conftest when a property fails) names the property, the
implementation, the device and the case; the case's seed rebuilds every tensor
bit for bit. ``--impl`` replays the same case against another implementation (say,
``reference``, to see the case is valid). Exit status: 0 passed, 1 failed, 2 skipped
(the implementation lacks the operation).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import traceback

import torch

from mla_fuse_conformance import cases as case_types
from mla_fuse_conformance.harness import NotProvided, property_named


def load(path: str) -> dict:
    return json.loads(pathlib.Path(path).read_text())


def replay(record: dict, impl_spec: str | None = None, device: str | None = None) -> int:
    from mla_fuse_conformance.implementation import load_implementation

    prop = property_named(record["property"])
    impl = load_implementation(impl_spec or record["impl"])
    if device is None:
        device = record.get("device", "cpu")
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"
    case = case_types.from_jsonable(record["case"])
    print(f"property: {prop.name}\nimplementation: {impl.spec}\ndevice: {device}\ncase: {case!r}")
    try:
        prop.run(impl, torch.device(device), case)
    except NotProvided as reason:
        print(f"SKIPPED: {reason}")
        return 2
    except Exception:  # noqa: BLE001 - the failure is what we came for
        traceback.print_exc()
        print("FAILED")
        return 1
    print("PASSED")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_fuse_conformance.repro", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a failure file from .mla_fuse_failures/")
    parser.add_argument("--impl", help="replay against this implementation instead of the recorded one")
    parser.add_argument("--device", help="replay on this device instead of the recorded one")
    options = parser.parse_args(argv)
    return replay(load(options.file), options.impl, options.device)


if __name__ == "__main__":
    sys.exit(main())
