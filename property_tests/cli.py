"""Command line of the conformance suite: ``mla-fuse {verify,repro,bench}``
(also ``python -m mla_fuse_conformance ...``). Works from any directory: the current
directory is importable, so ``--impl my_adapter:MyKernels`` finds ``./my_adapter.py``.

Each command is a function ``add_<command>(commands)`` that adds its subparser and sets
``run=`` to the function that carries it out (``args -> exit status``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from mla_fuse_conformance import fuzz, profiles


def add_verify(commands) -> None:
    verify = commands.add_parser("verify", help="run the conformance suite and print a per-operation report")
    verify.add_argument("--impl", default=None, help="SPEC: registered name or module.path:attr (default: "
                                                     "$MLA_FUSE_IMPL, then triton)")
    verify.add_argument("--profile", default=None, choices=profiles.NAMES,
                        help="hypothesis profile (default: ci under CI=true, else dev)")
    verify.add_argument("--report-dir", type=pathlib.Path, default=pathlib.Path(".mla_fuse_reports"),
                        help="where report.json, junit.xml and the metric lines go (default: ./.mla_fuse_reports)")
    verify.add_argument("--require", default=None, metavar="OP[,OP]",
                        help="operations that must be provided: a missing one fails instead of being skipped")
    verify.add_argument("-n", "--workers", default=None,
                        help="pytest-xdist workers (default: auto); a crashing kernel kills one worker, not the run")
    verify.add_argument("--map-rounds", type=int, default=6,
                        help="failing cells to look for per failing property (0: no conformance map, no limit checks)")
    verify.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")

    def run(args) -> int:
        from mla_fuse_conformance.implementation import ImplementationError, parse_required
        from mla_fuse_conformance.verify import run_verify

        try:
            require = parse_required(args.require)
        except ImplementationError as error:
            print(f"mla-fuse verify: {error}", file=sys.stderr)
            return 2
        return run_verify(args.impl, args.profile or profiles.default_profile(), args.report_dir.absolute(),
                          args.workers, args.pytest_args, require, args.map_rounds)

    verify.set_defaults(run=run)


def add_repro(commands) -> None:
    repro = commands.add_parser("repro", help="replay a saved failing case without hypothesis")
    repro.add_argument("file", type=pathlib.Path)
    repro.add_argument("--impl", default=None, help="override the implementation recorded in the file")
    repro.add_argument("--device", default=None, help="override the device recorded in the file")

    def run(args) -> int:
        from mla_fuse_conformance import repro as replay

        return replay.main([str(args.file), *(["--impl", args.impl] if args.impl else []),
                            *(["--device", args.device] if args.device else [])])

    repro.set_defaults(run=run)


def add_bench(commands) -> None:
    bench = commands.add_parser("bench", add_help=False,
                                help="time the fused op against the unfused pair and the reference "
                                     "(its arguments: mla-fuse bench --help)")

    def run(args) -> int:
        from mla_fuse_conformance import bench as benchmark

        benchmark.main(args.passed_on)
        return 0

    bench.set_defaults(run=run, passes_on=True)


COMMANDS = (add_verify, add_repro, add_bench, *fuzz.COMMANDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mla-fuse", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(commands)
    args, passed_on = parser.parse_known_args(argv)
    if passed_on and not getattr(args, "passes_on", False):
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")
    args.passed_on = passed_on  # a command that hands its arguments to another parser (bench)
    if "" not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` has it
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
