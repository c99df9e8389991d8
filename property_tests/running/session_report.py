"""The session's report for ``mla-fuse verify``: ``outcomes.jsonl`` and the failure files of
crashed xdist workers. The plugin (``plugin.py``) registers ``SessionReport`` on the controller,
or on the only process without xdist, when ``$MLA_FUSE_REPORT_DIR`` is set; it lives here, not in
the plugin, because the plugin imports nothing of the suite until the suite is in use."""

from __future__ import annotations

import json
import pathlib

import pytest

from mla_fuse_conformance.running import recording
from mla_fuse_conformance.settings import profiles

SKIP_PREFIX = "Skipped: "  # pytest's display of a skip's text in a report's longrepr (the exception class's name)


class SessionReport:
    """Writes ``outcomes.jsonl`` and the failure files of crashed workers (registered on the
    controller, or on the only process without xdist, when ``$MLA_FUSE_REPORT_DIR`` is set)."""

    def __init__(self, config, directory: pathlib.Path) -> None:
        self.config = config
        self.path = directory / recording.OUTCOMES_FILE

    def pytest_runtest_logreport(self, report):
        if not (report.when == "call" or report.outcome != "passed"):
            return
        extras = dict(report.user_properties)
        line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                "duration": round(getattr(report, "duration", 0.0), 3), "metrics": extras.get("mla_fuse_metrics"),
                "failure": extras.get("mla_fuse_failure")}
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            line["reason"] = skip_reason(report.longrepr)
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


def skip_reason(longrepr: tuple) -> str:
    """The text a test gave ``pytest.skip`` (or a skip mark's reason): pytest's report holds it as the
    exception's one-line form, ``"Skipped: <text>"``, and the report compares the text itself (a deployment
    skipped with ``not supported (declared): ...`` is counted as declared, ``commands/report/document.py``)."""
    return str(longrepr[2]).removeprefix(SKIP_PREFIX)


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
