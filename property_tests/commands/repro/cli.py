"""``mla-fuse repro FILE``: replay a saved failing case without hypothesis (``running/replay.py``). The
standalone reproducer ``verify`` writes per failing cell is ``repro/script.py``."""

from __future__ import annotations

import pathlib

from mla_fuse_conformance.declarations.options import CLI_IMPL_OPTION


def add_repro(commands) -> None:
    repro = commands.add_parser("repro", help="replay a saved failing case without hypothesis")
    repro.add_argument("file", type=pathlib.Path)
    repro.add_argument(CLI_IMPL_OPTION, dest="impl", default=None,
                       help="override the implementation recorded in the file")
    repro.add_argument("--device", default=None, help="override the device recorded in the file")
    repro.set_defaults(run=run)


def run(args) -> int:
    # start-up: `mla-fuse --help` imports this module (docs/STARTUP.md)
    from mla_fuse_conformance.running import replay

    return replay.main([str(args.file), *([CLI_IMPL_OPTION, args.impl] if args.impl else []),
                        *(["--device", args.device] if args.device else [])])
