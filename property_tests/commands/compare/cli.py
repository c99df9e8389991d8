"""``mla-fuse compare``: implementations side by side on one set of cases.

The command line here; the run in ``run.py``.

1. Draw each operation's cases once, from the whole contract (``cases.py``).
2. Run every case on every implementation, each in its own crash-isolating ``executor.Executor``
   child: ``pass``, ``fail`` (a wrong result, or an exception the kernel raised), ``crash``,
   ``hang``; a case outside an implementation's declared limits (or an operation it does not
   provide) is ``outside declared limits`` and does not run.
3. Where two implementations both pass a case, measure how far apart they are
   (``distances.py``).
4. Print one table (rows: operation and cell; columns: implementations) and the differences,
   and write ``REPORT_DIR/comparison.json`` (``report.py``, docs/REPORT.md).

The exit status is 0 when every case ran on every implementation, whatever the outcomes: a
failure or a difference is a finding of the comparison, not an error of the command (gate an
implementation with ``mla-fuse verify``). Bad arguments exit 2 before anything runs.
"""

from __future__ import annotations

import pathlib
import sys

from mla_fuse_conformance.declarations.operations import OPERATIONS
from mla_fuse_conformance.settings import profiles

DEFAULT_CASES = 40


def add_compare(commands) -> None:
    compare = commands.add_parser("compare", help="run one set of cases on several implementations, side by side")
    compare.add_argument("--impl", dest="impls", action="append", default=[], metavar="SPEC",
                         help="an implementation (registered name or module.path:attr); give two or more")
    compare.add_argument("--op", dest="operations", action="append", default=None, metavar="OP",
                         help=f"an operation to compare (repeatable; default: all of {', '.join(OPERATIONS)})")
    compare.add_argument("--cases", type=int, default=DEFAULT_CASES,
                         help=f"cases per operation (default {DEFAULT_CASES})")
    compare.add_argument("--profile", default=None, choices=profiles.NAMES,
                         help="hypothesis profile the sizes follow (gpu: model sizes; default: ci under CI=true, "
                              "else dev)")
    compare.add_argument("--seed", type=int, default=0, help="the seed the cases are drawn with (default 0)")
    compare.add_argument("--report-dir", type=pathlib.Path, default=pathlib.Path(".mla_fuse_reports"),
                         help="where comparison.json goes (default: ./.mla_fuse_reports)")
    compare.set_defaults(run=run)


def run(args) -> int:
    # start-up: `mla-fuse --help` imports this module (docs/STARTUP.md)
    from mla_fuse_conformance.commands.compare.run import run_compare

    problem = argument_error(args.impls, args.operations, args.cases)
    if problem is not None:
        print(f"mla-fuse compare: {problem}", file=sys.stderr)
        return 2
    profile = args.profile or profiles.default_profile()
    return run_compare(args.impls, list(dict.fromkeys(args.operations or OPERATIONS)), args.cases, profile,
                       args.report_dir.absolute(), args.seed)


def argument_error(impl_specs: list[str], operations: list[str] | None, cases: int) -> str | None:
    """What is wrong with the arguments, naming the argument, or None."""
    if len(impl_specs) < 2:
        return f"--impl: give at least two implementations to compare, got {len(impl_specs)}"
    if len(set(impl_specs)) < len(impl_specs):
        return f"--impl: each implementation once, got {', '.join(impl_specs)}"
    unknown = [op for op in operations or () if op not in OPERATIONS]
    if unknown:
        return f"--op: unknown operation {unknown[0]!r} (one of {', '.join(OPERATIONS)})"
    if cases < 1:
        return f"--cases: at least 1 case per operation, got {cases}"
    return None
