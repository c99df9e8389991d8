"""Command line of the conformance suite: ``mla-fuse {verify,repro,report,compare,adapter,fuzz,db}``
(also ``python -m mla_fuse_conformance ...``). Works from any directory: the current
directory is importable, so ``--impl my_adapter:MyKernels`` finds ``./my_adapter.py``.

Each command is a function ``add_<command>(commands)`` that adds its subparser and sets
``run=`` to the function that carries it out (``args -> exit status``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import sys

from mla_fuse_conformance.commands import fuzz
from mla_fuse_conformance.commands.adapter_template import add_adapter
from mla_fuse_conformance.commands.compare import add_compare
from mla_fuse_conformance.declarations.options import CLI_IMPL_OPTION, CLI_REQUIRE_OPTION, DEFAULT_IMPL, IMPL_ENV_VAR
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import recording


def add_verify(commands) -> None:
    verify = commands.add_parser("verify", help="run the conformance suite and print a per-operation report")
    verify.add_argument(CLI_IMPL_OPTION, dest="impl", default=None,
                        help=f"SPEC: registered name or module.path:attr "
                             f"(default: ${IMPL_ENV_VAR}, then {DEFAULT_IMPL})")
    verify.add_argument("--profile", default=None, choices=profiles.NAMES,
                        help="hypothesis profile (default: ci under CI=true, else dev)")
    verify.add_argument("--report-dir", type=pathlib.Path, default=pathlib.Path(".mla_fuse_reports"),
                        help="where report.json, junit.xml and the metric lines go (default: ./.mla_fuse_reports)")
    verify.add_argument(CLI_REQUIRE_OPTION, dest="require", default=None, metavar="OP[,OP]",
                        help="operations that must be provided: a missing one fails instead of being skipped")
    verify.add_argument("-n", "--workers", default=None,
                        help="pytest-xdist workers (default: auto); a crashing kernel kills one worker, not the run")
    verify.add_argument("--map-rounds", type=int, default=6,
                        help="failing cells to look for per failing property (0: no conformance map, no limit checks)")
    add_baseline_options(verify)
    verify.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")

    def run(args) -> int:
        from mla_fuse_conformance.contract.implementation import ImplementationError, parse_required
        from mla_fuse_conformance.commands import baseline
        from mla_fuse_conformance.commands.verify import run_verify

        try:
            require = parse_required(args.require)
            known = baseline.load(args.baseline, args.known_failures)
        except (ImplementationError, baseline.BaselineError) as error:
            print(f"mla-fuse verify: {error}", file=sys.stderr)
            return 2
        print("".join(f"mla-fuse verify: {note}\n" for note in (known.notes if known else ())), end="")
        return run_verify(args.impl, args.profile or profiles.default_profile(), args.report_dir.absolute(),
                          args.workers, args.pytest_args, require, args.map_rounds, known, args.write_known_failures)

    verify.set_defaults(run=run)


def add_baseline_options(verify) -> None:
    """Gate on new failures only (``commands/baseline.py``)."""
    verify.add_argument("--baseline", type=pathlib.Path, action="append", default=[], metavar="REPORT_JSON",
                        help="an earlier report.json: its failing ids are known; exit 0 when no failing id is new "
                             "(repeatable)")
    verify.add_argument("--known-failures", type=pathlib.Path, action="append", default=[], metavar="FILE",
                        help="a file of known failing ids, one per line, '#' comment lines (repeatable; combines "
                             "with --baseline)")
    verify.add_argument("--write-known-failures", type=pathlib.Path, default=None, metavar="FILE",
                        help="write this run's failing ids as a known-failures file")


def add_repro(commands) -> None:
    repro = commands.add_parser("repro", help="replay a saved failing case without hypothesis")
    repro.add_argument("file", type=pathlib.Path)
    repro.add_argument(CLI_IMPL_OPTION, dest="impl", default=None,
                       help="override the implementation recorded in the file")
    repro.add_argument("--device", default=None, help="override the device recorded in the file")

    def run(args) -> int:
        from mla_fuse_conformance.running import replay

        return replay.main([str(args.file), *([CLI_IMPL_OPTION, args.impl] if args.impl else []),
                            *(["--device", args.device] if args.device else [])])

    repro.set_defaults(run=run)


def add_report(commands) -> None:
    report = commands.add_parser("report", help="write report.html and summary.md again from a report directory")
    report.add_argument("dir", type=pathlib.Path, metavar="DIR",
                        help="a report directory: report.json (schema 1 or 2) and/or comparison.json")
    report.add_argument("--reproducers", action="store_true",
                        help="also write and run a standalone reproducer per failing cell (schema 2), as verify does")

    def run(args) -> int:
        from mla_fuse_conformance.commands import report_views

        return report_views.main(args.dir, args.reproducers)

    report.set_defaults(run=run)


COMMANDS = (add_verify, add_repro, add_report, add_compare, add_adapter, *fuzz.COMMANDS)


DESCRIPTION = """The mla_fuse conformance suite: verify an implementation of CONTRACT section 4 (yours, through
an adapter, or a shipped one), replay a saved failure, render a report directory's HTML page and
Markdown summary again, compare implementations side by side, write an adapter skeleton, fuzz with HypoFuzz, share the
example database.

Run `mla-fuse COMMAND --help` for a command's options."""


def version() -> str:
    try:
        return importlib.metadata.version("mla_fuse")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="mla-fuse", description=DESCRIPTION,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"mla-fuse {version()}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        recording.example_timeout()
    except ValueError as error:
        print(f"mla-fuse {args.command}: {error}", file=sys.stderr)
        return 2
    if "" not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` has it
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
