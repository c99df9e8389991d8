"""The pytest plugin of the conformance suite (entry point ``pytest11: mla_fuse``).

Installed with the package, so ``pytest --pyargs mla_fuse_conformance --impl=SPEC`` works from
any directory: the options are known before any test module is imported. It is
loaded into every pytest session of an environment where mla_fuse is installed, so it only

* adds ``--impl`` and ``--require``, and loads the implementation when one is named (an
  implementation that cannot be loaded stops the session with one line);
* registers the ``mla_fuse.*`` hypothesis profiles (prefixed: a project's own profiles are untouched);
* with ``$MLA_FUSE_REPORT_DIR`` set (``mla-fuse verify`` sets it), writes one JSON line per test
  outcome to ``outcomes.jsonl`` there, from pytest's report hooks (on the xdist controller, so a
  crashed worker's test is recorded too);
* turns a crashed xdist worker into a failure file: the example it was running is saved before it
  runs (``recording.inflight_path``), so it is attributed to its property and feature cell and
  replays with ``mla-fuse repro``;
* provides the suite's fixtures, ``mla_fuse_impl`` (the implementation under test; the properties
  draw within its declared capabilities) and ``mla_fuse_device``, and writes the failure file of a
  failing property (the hooks act only on examples the suite ran);
* prints the mutation self-test table when a session wrote one.

The suite has no conftest.py: pytest does not load one from a package outside the rootdir (as
an installed suite run with ``--pyargs`` from the user's directory is), a plugin always loads.
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid

import pytest

from mla_fuse_conformance.contract.implementation import (IMPL_ENV_VAR, ImplementationError, load_implementation,
                                                 parse_required, resolve_spec)

try:  # without the `test` extra the plugin still loads (it is in every session), but does little
    from mla_fuse_conformance.settings import profiles
    from mla_fuse_conformance.running import recording
except ImportError:  # hypothesis is missing
    profiles = recording = None

SESSION_ID = os.environ.setdefault("MLA_FUSE_SESSION_ID", uuid.uuid4().hex)
OUTCOMES_FILE = "outcomes.jsonl"
_IMPL = pytest.StashKey[object]()


def pytest_addoption(parser):
    group = parser.getgroup("mla_fuse", "mla_fuse conformance suite")
    group.addoption(
        "--impl", default=None, metavar="SPEC",
        help=f"implementation under test: a registered name (triton, reference, vllm, flashinfer, sglang, "
             f"mutant:NAME) or 'module.path:attr' (the current directory is importable); falls back to "
             f"${IMPL_ENV_VAR}, then 'triton'",
    )
    group.addoption(
        "--require", default=None, metavar="OP[,OP]",
        help="operations the implementation must provide: a missing one fails instead of being skipped "
             "(adds to the adapter's own `required`)",
    )


def loaded_implementation(config):
    """The implementation of this session, loaded once (``--impl``, ``--require``)."""
    if _IMPL not in config.stash:
        require = parse_required(config.getoption("--require"))
        config.stash[_IMPL] = load_implementation(config.getoption("--impl"), require)
    return config.stash[_IMPL]


def pytest_configure(config):
    if recording is not None:
        recording.RECORDER.track_inflight = True
        profiles.EXPLICIT = config.getoption("hypothesis_profile", None) is not None
    if config.getoption("--impl") or config.getoption("--require") or os.environ.get(IMPL_ENV_VAR):
        try:
            loaded_implementation(config)
        except ImplementationError as error:
            raise pytest.UsageError(str(error)) from None
    directory = os.environ.get("MLA_FUSE_REPORT_DIR")
    if directory and recording is not None and not hasattr(config, "workerinput"):  # not an xdist worker
        config.pluginmanager.register(SessionReport(config, pathlib.Path(directory)), "mla_fuse_session_report")


def pytest_unconfigure(config):
    if recording is not None:
        recording.RECORDER.close()


def pytest_report_collectionfinish(config, items):
    if not any(item.nodeid and "mla_fuse_impl" in getattr(item, "fixturenames", ()) for item in items):
        return None
    from hypothesis import settings

    from mla_fuse_conformance.cases import strategies
    from mla_fuse_conformance.running.devices import select_device

    return (f"mla_fuse: implementation {resolve_spec(config.getoption('--impl'))}, hypothesis profile "
            f"{settings.get_current_profile_name()!r}, sizes "
            f"{'large' if strategies.limits() is strategies.LARGE else 'small'}, device {select_device()}")


# ---------------------------------------------------------------- fixtures and failure files of the suite


@pytest.fixture(scope="session")
def mla_fuse_impl(request):
    """The implementation under test (``implementation.Implementation``); the properties draw
    within its declared capabilities."""
    from mla_fuse_conformance.running import harness

    loaded = loaded_implementation(request.config)
    harness.use_implementation(loaded)
    return loaded


@pytest.fixture(scope="session")
def mla_fuse_device():
    """CUDA if available (xdist worker N uses GPU N % count), else the CPU; $MLA_FUSE_DEVICE overrides."""
    from mla_fuse_conformance.running.devices import select_device

    return select_device()


def pytest_fixture_post_finalizer(fixturedef, request):
    """HypoFuzz enters a test again after tearing its fixtures down (``running/reentry.py``)."""
    from mla_fuse_conformance.running.reentry import forget_finalized_fixture

    forget_finalized_fixture(fixturedef, request)


def pytest_runtest_setup(item):
    if recording is not None:
        recording.RECORDER.reset()
        recording.RECORDER.nodeid = item.nodeid


@pytest.hookimpl(tryfirst=True)  # after hypothesis' own hook wrapper has set its key
def pytest_runtest_call(item):
    if profiles is not None and "mla_fuse_impl" in getattr(item, "fixturenames", ()):
        from mla_fuse_conformance.settings.database import key_by_suite_node_id

        key_by_suite_node_id(item)  # one example-database key per property, the key HypoFuzz uses


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    recorder = recording.RECORDER if recording is not None else None
    if report.when != "call" or recorder is None or recorder.stats is None:
        return  # not an example of the suite
    from hypothesis import settings

    failure_file = None
    if report.failed and recorder.last_failure is not None:
        if call.excinfo is not None and call.excinfo.typename in ("FlakyFailure", "Flaky"):  # not a plain failure
            recorder.last_failure = dict(recorder.last_failure, kind=f"did not reproduce: "
                                         f"{recorder.last_failure.get('kind')} once, passed when hypothesis ran it again")
        profile = settings.get_current_profile_name()
        failure_file = recording.save_failure(recorder.last_failure, item.nodeid, profile)
        report.sections.append(("mla_fuse: reproduce this failure",
                                recording.describe_failure(recorder.last_failure, failure_file, item.nodeid, profile)))
    # read by SessionReport.pytest_runtest_logreport (on the xdist controller too)
    report.user_properties.append(("mla_fuse_metrics", recorder.stats.as_record(report.outcome)))
    if failure_file is not None:
        report.user_properties.append(("mla_fuse_failure", dict(recorder.last_failure, file=str(failure_file))))


# ---------------------------------------------------------------- the session's report (mla-fuse verify)


class SessionReport:
    """Writes ``outcomes.jsonl`` and the failure files of crashed workers (registered on the
    controller, or on the only process without xdist, when ``$MLA_FUSE_REPORT_DIR`` is set)."""

    def __init__(self, config, directory: pathlib.Path) -> None:
        self.config = config
        self.path = directory / OUTCOMES_FILE

    def pytest_runtest_logreport(self, report):
        if not (report.when == "call" or report.outcome != "passed"):
            return
        extras = dict(report.user_properties)
        line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                "duration": round(getattr(report, "duration", 0.0), 3), "metrics": extras.get("mla_fuse_metrics"),
                "failure": extras.get("mla_fuse_failure")}
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            line["reason"] = str(report.longrepr[2])
        elif report.failed:
            line["message"] = str(getattr(report, "longreprtext", ""))[-2000:]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as stream:
            stream.write(json.dumps(line, sort_keys=True) + "\n")

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem, report, sched):
        """xdist: a worker died running ``crashitem``; the example it was running is in its in-flight
        file. Save it as a failure file, attributed to the property and the case's features."""
        found = crashed_example(crashitem)
        if found is None:
            return
        record, stacks = found
        profile = self.config.getoption("hypothesis_profile", None) or profiles.full_name(profiles.default_profile())
        if record.get("finished"):
            failure = dict(record, kind="crashed after it finished", error_type="crash",
                           error=f"the worker process died after this example, its test's last, had finished (a "
                                 f"stray write found later, e.g. by the allocator?) ({report.longrepr})")
        elif stacks:
            failure = dict(record, kind="hung", error_type="hang",
                           error=f"no result in {record.get('timeout')} s (${recording.TIMEOUT_ENV}); the worker was "
                                 f"ended; its threads were at (most recent call first):\n{stacks[:3000]}")
        else:
            failure = dict(record, kind="crashed", error_type="crash",
                           error=f"the worker process died running this example ({report.longrepr})")
        saved = recording.save_failure(failure, crashitem, profile)
        report.sections.append(("mla_fuse: reproduce this failure",
                                recording.describe_failure(failure, saved, crashitem, profile)))
        report.user_properties.append(("mla_fuse_failure", dict(failure, file=str(saved))))


def crashed_example(nodeid: str) -> tuple[dict, str] | None:
    """The in-flight example a dead process left for test ``nodeid`` (and remove it), with the
    thread stacks its hang watchdog wrote ("" when it crashed rather than hung); else the
    example of that test that finished last (``record["finished"]``), else None."""
    directory = recording.failure_dir()
    for pattern, finished in (("inflight-*.json", False), ("inflight-*.finished", True)):
        for path in sorted(directory.glob(pattern)):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if record.get("nodeid") != nodeid:
                continue
            path.unlink(missing_ok=True)
            stacks_file = recording.stacks_path(path)
            try:
                stacks = stacks_file.read_text().strip()
            except OSError:
                stacks = ""
            stacks_file.unlink(missing_ok=True)
            return dict(record, finished=finished), stacks
    return None


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
