"""The conformance map's options on ``mla-fuse verify``: how many failing cells to look for per failing
property, and the known failures it gates against (``conformance_map/baseline.py``)."""

from __future__ import annotations

import pathlib


def add_map_options(verify) -> None:
    verify.add_argument("--map-rounds", type=int, default=6,
                        help="failing cells to look for per failing property (0: no conformance map, no limit checks)")
    add_baseline_options(verify)


def add_baseline_options(verify) -> None:
    """Gate on new failures only (``conformance_map/baseline.py``)."""
    verify.add_argument("--baseline", type=pathlib.Path, action="append", default=[], metavar="REPORT_JSON",
                        help="an earlier report.json: its failing ids are known; exit 0 when no failing id is new "
                             "(repeatable)")
    verify.add_argument("--known-failures", type=pathlib.Path, action="append", default=[], metavar="FILE",
                        help="a file of known failing ids, one per line, '#' comment lines (repeatable; combines "
                             "with --baseline)")
    verify.add_argument("--write-known-failures", type=pathlib.Path, default=None, metavar="FILE",
                        help="write this run's failing ids as a known-failures file")
