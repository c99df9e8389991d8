"""This repository's own tests: they use the suite's modules directly, under the suite's profile,
and the mutation self-tests report a table at the end of the session.

``mutant_results`` appends one row per mutant to a file of this session (named by the xdist
controller and handed to its workers); the table is printed in the terminal summary.
"""

from __future__ import annotations

import json
import pathlib
import uuid

import pytest

_ROWS = pytest.StashKey[pathlib.Path]()
_WORKER_KEY = "mla_fuse_mutant_rows"


def pytest_configure(config):
    from mla_fuse_conformance.settings import profiles

    profiles.select_default(explicit=config.getoption("hypothesis_profile", None) is not None)
    if hasattr(config, "workerinput"):
        config.stash[_ROWS] = pathlib.Path(config.workerinput[_WORKER_KEY])
    else:
        reports = pathlib.Path(".mla_fuse_reports").absolute()
        config.stash[_ROWS] = reports / f"mutants-{uuid.uuid4().hex[:12]}.jsonl"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker appends to the controller's file."""
    node.workerinput[_WORKER_KEY] = str(node.config.stash[_ROWS])


@pytest.fixture
def mutant_results(request):
    """``append(row)``: one row of the mutation self-test's table."""
    path = request.config.stash[_ROWS]

    def append(row: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as stream:
            stream.write(json.dumps(row, sort_keys=True) + "\n")

    return append


def mutant_table(rows: list[dict]) -> list[str]:
    lines = [f"{'mutant':38} {'result':9} {'seconds':>8} {'examples':>8}  caught by"]
    for row in sorted(rows, key=lambda r: r["mutant"]):
        lines.append(f"{row['mutant']:38} {row['result']:9} {row['seconds']:8.2f} {row['examples']:8d}  "
                     f"{row.get('property') or '-'}")
    return lines


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput"):
        return
    path = config.stash[_ROWS]
    if not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.unlink()
    if rows:
        terminalreporter.write_sep("-", "mla_fuse mutation self-test")
        for line in mutant_table(rows):
            terminalreporter.write_line(line)
