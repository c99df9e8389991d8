"""Profiles, the device fixture, and what a failing property leaves behind (see README.md)."""

from __future__ import annotations

import pytest
from hypothesis import settings

from property_tests import plugin, profiles, recording, strategies
from property_tests.devices import select_device
from property_tests.recording import RECORDER

settings.load_profile(profiles.default_profile())  # --hypothesis-profile, read later by hypothesis, wins


@pytest.fixture(scope="session")
def device():
    """CUDA if available (xdist worker N uses GPU N % count), else the CPU; $MLA_FUSE_DEVICE overrides."""
    return select_device()


def pytest_report_header(config):
    return (f"mla_fuse properties: hypothesis profile {settings.get_current_profile_name()!r}, "
            f"sizes {'large' if strategies.limits() is strategies.LARGE else 'small'}, device {select_device()}")


def pytest_runtest_setup(item):
    RECORDER.reset()


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


def pytest_configure(config):
    if not config.pluginmanager.has_plugin(plugin.__name__):
        config.pluginmanager.register(plugin, plugin.__name__)
