"""``mla-fuse report DIR``: write report.html and summary.md again from a report directory
(``report/views.py``)."""

from __future__ import annotations

import pathlib


def add_report(commands) -> None:
    report = commands.add_parser("report", help="write report.html and summary.md again from a report directory")
    report.add_argument("dir", type=pathlib.Path, metavar="DIR",
                        help="a report directory: report.json (schema 1 or 2) and/or comparison.json")
    report.add_argument("--reproducers", action="store_true",
                        help="also write and run a standalone reproducer per failing cell (schema 2), as verify does")
    report.set_defaults(run=run)


def run(args) -> int:
    # start-up: `mla-fuse --help` imports this module (docs/STARTUP.md)
    from mla_fuse_conformance.commands.report import views

    return views.main(args.dir, args.reproducers)
