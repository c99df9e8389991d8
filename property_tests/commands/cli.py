"""Command line of the conformance suite: ``mla-fuse {verify,repro,report,compare,adapter,fuzz,db}``
(also ``python -m mla_fuse_conformance ...``). Works from any directory: the current
directory is importable, so ``--impl my_adapter:MyKernels`` finds ``./my_adapter.py``.

Each command lives in its own room of ``commands/`` (``verify/``, ``repro/``, ``report/``, ``compare/``,
``adapter/``, ``fuzz/``; the conformance map's options are ``conformance_map/cli.py``), whose ``cli.py``
is its entry: a function ``add_<command>(commands)`` that adds its subparser and sets ``run=`` to the
function that carries it out (``args -> exit status``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

from mla_fuse_conformance.commands.adapter.cli import add_adapter
from mla_fuse_conformance.commands.compare.cli import add_compare
from mla_fuse_conformance.commands.fuzz import cli as fuzz
from mla_fuse_conformance.commands.report.cli import add_report
from mla_fuse_conformance.commands.repro.cli import add_repro
from mla_fuse_conformance.commands.verify.cli import add_verify
from mla_fuse_conformance.running import recording


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
