"""Fixtures, the default profile, and what a failing property leaves behind (see README.md).

Options (``--impl``) and the profiles come from the suite's pytest plugin (``plugin.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from mla_fuse_conformance import profiles, recording, strategies
from mla_fuse_conformance.database import key_by_suite_node_id
from mla_fuse_conformance.devices import select_device
from mla_fuse_conformance.implementation import load_implementation
from mla_fuse_conformance.recording import RECORDER


def pytest_configure(config):
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(profiles.full_name(profiles.default_profile()))


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (mla_fuse_conformance.implementation.Implementation)."""
    return load_implementation(request.config.getoption("--impl"))


@pytest.fixture(scope="session")
def device():
    """CUDA if available (xdist worker N uses GPU N % count), else the CPU; $MLA_FUSE_DEVICE overrides."""
    return select_device()


def pytest_report_header(config):
    return (f"mla_fuse properties: hypothesis profile {settings.get_current_profile_name()!r}, "
            f"sizes {'large' if strategies.limits() is strategies.LARGE else 'small'}, device {select_device()}")


def pytest_runtest_setup(item):
    RECORDER.reset()


@pytest.hookimpl(tryfirst=True)  # after hypothesis' own hook wrapper has set its key
def pytest_runtest_call(item):
    key_by_suite_node_id(item)  # one example-database key per property, the key HypoFuzz uses


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    if report.failed and RECORDER.last_failure is not None:
        profile = settings.get_current_profile_name()
        path = recording.save_failure(RECORDER.last_failure, item.nodeid, profile)
        report.sections.append(("mla_fuse: reproduce this failure",
                                recording.describe_failure(RECORDER.last_failure, path, item.nodeid, profile)))
    recording.append_metrics(RECORDER.stats, report.outcome)
