"""The pytest plugin of the conformance suite (entry point ``pytest11: mla_fuse``).

Installed with the package, so ``pytest --pyargs mla_fuse_conformance --impl=SPEC`` works from
any directory: the options are known before the suite's own ``conftest.py`` is found. It is
loaded into every pytest session of an environment where mla_fuse is installed, so it only
adds options, registers the ``mla_fuse.*`` hypothesis profiles (prefixed, so a project's own
profiles are untouched), and prints the mutation self-test table when a session wrote one;
everything else (fixtures, the default profile, failure files) lives in the suite's conftest
and applies only when the suite is collected.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

from mla_fuse_conformance.implementation import IMPL_ENV_VAR, resolve_spec

try:  # without the `test` extra the plugin still loads (it is in every session), but does nothing
    from mla_fuse_conformance import profiles, recording
except ImportError:  # hypothesis is missing
    profiles = recording = None

SESSION_ID = os.environ.setdefault("MLA_FUSE_SESSION_ID", uuid.uuid4().hex)


def pytest_addoption(parser):
    group = parser.getgroup("mla_fuse", "mla_fuse conformance suite")
    group.addoption(
        "--impl", default=None, metavar="SPEC",
        help=f"implementation under test: a registered name (triton, reference, vllm, mutant:NAME) or "
             f"'module.path:attr' (the current directory is importable); falls back to ${IMPL_ENV_VAR}, "
             f"then 'triton'",
    )


def pytest_configure(config):
    # A 'module:attr' spec names the user's module; make the invocation directory importable,
    # as `python -m pytest` would (xdist workers run this too).
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


def pytest_report_header(config):
    return f"mla_fuse implementation under test: {resolve_spec(config.getoption('--impl'))}"


def pytest_terminal_summary(terminalreporter):
    """The mutation self-test's table (tests/test_mutants.py), when this session wrote rows."""
    if recording is None:
        return
    path = recording.report_dir_or_default() / "mutants.jsonl"
    if not path.exists():
        return
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("session") == SESSION_ID]
    if rows:
        terminalreporter.write_sep("-", "mla_fuse mutation self-test")
        for line in recording.mutant_table(rows):
            terminalreporter.write_line(line)


if profiles is not None:
    profiles.register()
