"""The conformance map's options on ``mla-fuse verify``: how many failing cells to look for per failing
property, how long the whole map may take, and the known failures it gates against (``conformance_map/baseline.py``)."""

from __future__ import annotations

import argparse
import pathlib

MAP_SECONDS = 600  # verify's default --map-seconds (verify/maps.py's DEFAULT_SECONDS)


def seconds(text: str) -> float:
    """``--map-seconds``: a number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return int(value) if value.is_integer() else value


def add_map_options(verify) -> None:
    verify.add_argument("--map-rounds", type=int, default=6,
                        help="failing cells to look for per failing property (0: no conformance map, no limit checks)")
    verify.add_argument("--map-seconds", type=seconds, default=MAP_SECONDS, metavar="SECONDS",
                        help=f"time budget of the whole map phase, the limit checks included (default: {MAP_SECONDS}: "
                             "ten minutes, so the properties (minutes) and the map fit a CI job of an hour, the "
                             "report written before the job's limit; 0: no conformance map, no limit checks). The "
                             "properties with the most failing tests are mapped first; those left are listed as "
                             "not mapped")
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
