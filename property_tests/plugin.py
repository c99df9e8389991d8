"""The end-of-session table of the mutation self-test (tests/test_mutants.py).

Registered by ``property_tests/conftest.py`` when the property suite is collected; a root
``conftest.py`` may also list it (``pytest_plugins = ("property_tests.plugin",)``) so that
``pytest tests/test_mutants.py`` alone prints the table. One id per session, inherited by
xdist workers, picks this session's rows out of ``mutants.jsonl``.
"""

from __future__ import annotations

import json
import os
import uuid

from property_tests import recording

SESSION_ID = os.environ.setdefault(recording.SESSION_ENV_VAR, uuid.uuid4().hex)


def pytest_terminal_summary(terminalreporter):
    path = recording.report_dir_or_default() / "mutants.jsonl"
    if not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("session") == SESSION_ID]
    if rows:
        terminalreporter.write_sep("-", "mla_fuse mutation self-test")
        for line in recording.mutant_table(rows):
            terminalreporter.write_line(line)
