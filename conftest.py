"""Options shared by tests/ and property_tests/: which implementation of the contract is under test."""

import pytest

import property_tests.profiles  # noqa: F401  (registers the hypothesis profiles for any selection of tests)
from mla_fuse.implementation import IMPL_ENV_VAR, load_implementation, resolve_spec

# The mutation self-test's end-of-session table, also when tests/test_mutants.py runs alone.
pytest_plugins = ("property_tests.plugin",)


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default=None, metavar="SPEC",
        help=f"implementation under test: a registered name (reference, triton, mutant:NAME) or "
             f"'module.path:attr'; falls back to ${IMPL_ENV_VAR}, then 'triton'",
    )


def pytest_report_header(config):
    return f"mla_fuse implementation under test: {resolve_spec(config.getoption('--impl'))}"


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (mla_fuse.implementation.Implementation)."""
    return load_implementation(request.config.getoption("--impl"))
