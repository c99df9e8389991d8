"""Fixtures, the default profile, and what a failing property leaves behind (see README.md).

Options (``--impl``, ``--require``), the profiles and the session's report come from the suite's
pytest plugin (``plugin.py``); this conftest applies only when the suite is collected.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from mla_fuse_conformance import harness, profiles, recording, strategies
from mla_fuse_conformance.devices import select_device
from mla_fuse_conformance.plugin import loaded_implementation
from mla_fuse_conformance.recording import RECORDER


def pytest_configure(config):
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(profiles.full_name(profiles.default_profile()))
    RECORDER.track_inflight = True


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (mla_fuse_conformance.implementation.Implementation); the
    properties draw within its declared capabilities."""
    loaded = loaded_implementation(request.config)
    harness.use_implementation(loaded)
    return loaded


@pytest.fixture(scope="session")
def device():
    """CUDA if available (xdist worker N uses GPU N % count), else the CPU; $MLA_FUSE_DEVICE overrides."""
    return select_device()


def pytest_report_header(config):
    return (f"mla_fuse properties: hypothesis profile {settings.get_current_profile_name()!r}, "
            f"sizes {'large' if strategies.limits() is strategies.LARGE else 'small'}, device {select_device()}")


def pytest_runtest_setup(item):
    RECORDER.reset()
    RECORDER.nodeid = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    failure_file = None
    if report.failed and RECORDER.last_failure is not None:
        profile = settings.get_current_profile_name()
        failure_file = recording.save_failure(RECORDER.last_failure, item.nodeid, profile)
        report.sections.append(("mla_fuse: reproduce this failure",
                                recording.describe_failure(RECORDER.last_failure, failure_file, item.nodeid, profile)))
    # read by the plugin's pytest_runtest_logreport (on the xdist controller too)
    if RECORDER.stats is not None:
        report.user_properties.append(("mla_fuse_metrics", RECORDER.stats.as_record(report.outcome)))
    if failure_file is not None:
        report.user_properties.append(("mla_fuse_failure", dict(RECORDER.last_failure, file=str(failure_file))))
