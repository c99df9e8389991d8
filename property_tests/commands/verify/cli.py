"""``mla-fuse verify``: run the conformance suite against one implementation, map what fails, write the
report (``verify/run.py``)."""

from __future__ import annotations

import pathlib
import sys

from mla_fuse_conformance.commands.conformance_map.cli import add_map_options
from mla_fuse_conformance.declarations.options import CLI_IMPL_OPTION, CLI_REQUIRE_OPTION, DEFAULT_IMPL, IMPL_ENV_VAR
from mla_fuse_conformance.settings import profiles


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
    add_map_options(verify)
    verify.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    verify.set_defaults(run=run)


def run(args) -> int:
    # start-up: `mla-fuse --help` imports this module (docs/STARTUP.md)
    from mla_fuse_conformance.contract.implementation import ImplementationError, parse_required
    from mla_fuse_conformance.commands.conformance_map import baseline
    from mla_fuse_conformance.commands.verify.run import run_verify

    try:
        require = parse_required(args.require)
        known = baseline.load(args.baseline, args.known_failures)
    except (ImplementationError, baseline.BaselineError) as error:
        print(f"mla-fuse verify: {error}", file=sys.stderr)
        return 2
    print("".join(f"mla-fuse verify: {note}\n" for note in (known.notes if known else ())), end="")
    return run_verify(args.impl, args.profile or profiles.default_profile(), args.report_dir.absolute(),
                      args.workers, args.pytest_args, require, args.map_rounds, known, args.write_known_failures,
                      args.map_seconds)
