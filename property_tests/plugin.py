"""The pytest plugin of the conformance suite (entry point ``pytest11: mla_fuse``).

Installed with the package, so ``pytest --pyargs mla_fuse_conformance --mla-fuse-impl=SPEC``
works from any directory: the options are known before any test module is imported.

pytest loads it into every session of an environment where mla_fuse is installed, so it is a
guest, as hypothesis' own plugin is:

* at import it loads the standard library, pytest and the option names of
  ``declarations.options`` only (no torch, hypothesis or Triton: tests/test_implementation.py), and
  at registration its hook specifications (``hookspecs.py``, standard library only); every other
  import is inside the hook or fixture that needs it, marked ``deferred: a guest plugin``;
* its options are all ``--mla-fuse-*`` (``--mla-fuse-impl``, ``--mla-fuse-require``,
  ``--mla-fuse-shrink-seconds``), so a project's own ``--impl`` keeps working;
* it writes nothing to ``os.environ``, registers and loads no hypothesis profile and writes no
  file until the suite is in use: one of its test files is collected, one of its options (or
  ``$MLA_FUSE_IMPL``) is given, or a ``mla_fuse.*`` profile is named.

When the suite is in use it

* loads the implementation when one is named (an implementation that cannot be loaded stops
  the session with one line);
* deselects the properties that would only skip for it, and filters the third-party warnings
  of ``declarations/third_party_warnings.py``;
* registers the ``mla_fuse.*`` hypothesis profiles and, unless ``--hypothesis-profile`` names
  one, loads ``mla_fuse.ci`` under ``CI=true``, else ``mla_fuse.dev``;
* where there is no GPU and ``TRITON_INTERPRET`` is unset, sets ``TRITON_INTERPRET=1`` before the
  implementation is imported, so an adapter's ``@triton.jit`` kernels run under Triton's interpreter
  as the suite's own do, and corrects the interpreter's artifacts for every kernel of the session
  (``devices.triton_kernels_for_the_run``; ``running/interpreter_corrections.py`` lists them);
* with ``--mla-fuse-shrink-seconds=S`` (``mla-fuse verify`` gives it in the dev profile), stops
  hypothesis' shrinking of a failing property after ``S`` seconds (``profiles.bound_shrinking``: hypothesis'
  own stop for slow shrinking, sooner), and marks such a failure ``shrinking`` cut short;
* in an xdist worker, gives torch its share of the CPU threads (``share_cpu_threads``) unless
  ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set;
* with ``$MLA_FUSE_REPORT_DIR`` set (``mla-fuse verify`` sets it), writes one JSON line per test
  outcome to ``outcomes.jsonl`` there, from pytest's report hooks (on the xdist controller, so a
  crashed worker's test is recorded too);
* turns a crashed xdist worker into a failure file: the example it was running is saved before it
  runs (``recording.inflight_path``), so it is attributed to its property and feature cell and
  replays with ``python -m mla_fuse_conformance repro``;
* provides the suite's fixtures, ``mla_fuse`` (the requesting test's ``harness.PropertyRun``),
  ``mla_fuse_impl`` (the implementation under test; the properties draw within its declared
  capabilities) and ``mla_fuse_device``, and writes the failure file of a failing property (the
  hooks act only on examples the suite ran): the case hypothesis reported, not the last example
  that failed (``running/failure_text.py``).

The suite has no conftest.py: pytest does not load one from a package outside the rootdir (as
an installed suite run with ``--pyargs`` from the user's directory is), a plugin always loads.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import os
import pathlib

import pytest

from mla_fuse_conformance.declarations.options import (DEFAULT_IMPL, IMPL_ENV_VAR, PYTEST_IMPL_OPTION,
                                                       PYTEST_REQUIRE_OPTION, PYTEST_SHRINK_OPTION)

REPORT_DIR_ENV = "MLA_FUSE_REPORT_DIR"
PROFILE_PREFIX = "mla_fuse."


@dataclasses.dataclass
class SuiteState:
    """What the plugin holds for one session (in ``config.stash``)."""

    in_use: bool = False
    implementation: object = None
    recorder: object = None  # running.recording.Recorder, made when the suite is first used
    properties: dict = dataclasses.field(default_factory=dict)  # test function -> harness.Property


_STATE = pytest.StashKey[SuiteState]()


def state(config) -> SuiteState:
    if _STATE not in config.stash:
        config.stash[_STATE] = SuiteState()
    return config.stash[_STATE]


def pytest_addhooks(pluginmanager):
    from mla_fuse_conformance import hookspecs  # deferred: a guest plugin

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser):
    group = parser.getgroup("mla_fuse", "mla_fuse conformance suite")
    group.addoption(
        PYTEST_IMPL_OPTION, dest="mla_fuse_impl", default=None, metavar="SPEC",
        help=f"implementation under test: a registered name (triton, reference, vllm, flashinfer, sglang, "
             f"mutant:NAME) or 'module.path:attr' (the current directory is importable); falls back to "
             f"${IMPL_ENV_VAR}, then '{DEFAULT_IMPL}'",
    )
    group.addoption(
        PYTEST_REQUIRE_OPTION, dest="mla_fuse_require", default=None, metavar="OP[,OP]",
        help="operations the implementation must provide: a missing one fails instead of being skipped "
             "(adds to the adapter's own `required`)",
    )
    group.addoption(
        PYTEST_SHRINK_OPTION, dest="mla_fuse_shrink_seconds", default=None, type=float, metavar="SECONDS",
        help="stop shrinking a failing property after this many seconds (hypothesis' own limit: 300); the "
             "failure keeps the smallest case found by then, and says that shrinking was cut short",
    )


def suite_directory() -> pathlib.Path | None:
    """Where the suite's modules are (without importing it)."""
    spec = importlib.util.find_spec("mla_fuse_conformance")
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()


def start_suite(config) -> None:
    """The suite is in use in this session: register and select its profiles, track examples."""
    current = state(config)
    if current.in_use:
        return
    current.in_use = True
    from mla_fuse_conformance.declarations.third_party_warnings import FILTERWARNINGS  # deferred: a guest plugin
    from mla_fuse_conformance.running import devices, recording  # deferred: a guest plugin
    from mla_fuse_conformance.settings import profiles  # deferred: a guest plugin

    for line in FILTERWARNINGS:
        config.addinivalue_line("filterwarnings", line)
    profiles.register()
    profiles.select_default(explicit=config.getoption("hypothesis_profile", None) is not None)
    devices.triton_kernels_for_the_run()  # before the adapter is imported
    if config.getoption("mla_fuse_shrink_seconds", None) is not None:
        try:
            profiles.bound_shrinking(config.getoption("mla_fuse_shrink_seconds"))
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
    current.recorder = recording.Recorder(track_inflight=True)
    share_cpu_threads(config)


def share_cpu_threads(config) -> None:
    """An xdist worker takes its share of torch's CPU threads, its default divided by the workers
    (``running.devices.worker_threads``: the suite's own work is CPU torch work, and N workers each
    with one thread per core wait on each other); ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set by
    the user is left as it is, and one process (no ``-n``) keeps torch's default."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if not workers:
        return
    from mla_fuse_conformance.running.devices import worker_threads  # deferred: a guest plugin

    threads = worker_threads(workers)
    if threads is not None:
        import torch  # deferred: a guest plugin

        torch.set_num_threads(threads)


def loaded_implementation(config):
    """The implementation of this session, loaded once (``--mla-fuse-impl``, ``--mla-fuse-require``)."""
    current = state(config)
    if current.implementation is None:
        # deferred: a guest plugin
        from mla_fuse_conformance.contract.implementation import load_implementation, parse_required

        require = parse_required(config.getoption("mla_fuse_require"), PYTEST_REQUIRE_OPTION)
        current.implementation = load_implementation(config.getoption("mla_fuse_impl"), require, PYTEST_IMPL_OPTION)
    return current.implementation


@pytest.hookimpl(tryfirst=True)  # before hypothesis' plugin loads a named profile, which must be registered
def pytest_configure(config):
    config.addinivalue_line("markers", "mla_fuse(*operations, bad_input=False, examples_per_corruption=None, "
                                       "timeout_factor=1): "
                                       "a property of the mla_fuse conformance suite and the operations it checks")
    profile = config.getoption("hypothesis_profile", None) or ""
    named = config.getoption("mla_fuse_impl") or config.getoption("mla_fuse_require") or os.environ.get(IMPL_ENV_VAR)
    if profile.startswith(PROFILE_PREFIX) or named or config.getoption("mla_fuse_shrink_seconds") is not None:
        start_suite(config)
    if named:
        from mla_fuse_conformance.contract.implementation import ImplementationError  # deferred: a guest plugin

        try:
            loaded_implementation(config)
        except ImplementationError as error:
            raise pytest.UsageError(str(error)) from None
    if hasattr(config, "workerinput"):  # registered first, so it runs last: after pytest's own cleanup
        config.add_cleanup(lambda: state(config).in_use and gc.unfreeze())  # see pytest_sessionfinish
    directory = os.environ.get(REPORT_DIR_ENV)
    if directory and not hasattr(config, "workerinput"):  # not an xdist worker
        start_suite(config)
        from mla_fuse_conformance.running.session_report import SessionReport  # deferred: a guest plugin

        config.pluginmanager.register(SessionReport(config, pathlib.Path(directory)), "mla_fuse_session_report")


@pytest.hookimpl(tryfirst=True)
def pytest_collect_file(file_path, parent):
    """One of the suite's test files is about to be imported: the suite is in use (its profile
    must be selected before its modules read ``settings.default``)."""
    if state(parent.config).in_use or not file_path.name.startswith("test_") or file_path.suffix != ".py":
        return None
    suite = suite_directory()
    if suite is not None and suite in file_path.resolve().parents:
        start_suite(parent.config)
    return None


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session):
    """Freeze an xdist worker's heap until its teardown is over: execnet interrupts (SIGINT) a
    teardown longer than 5 s, and pytest's full garbage collection of what Inductor and Triton
    leave took that long (the interpreter's exit collects it, so nanobind's leak check still passes)."""
    if hasattr(session.config, "workerinput") and state(session.config).in_use:
        gc.freeze()


def pytest_unconfigure(config):
    if state(config).recorder is not None:
        state(config).recorder.close()


def pytest_collection_modifyitems(config, items):
    """Deselect the properties that would only skip for the implementation (``contract/applicable.py``)."""
    if state(config).implementation is not None:
        from mla_fuse_conformance.contract.applicable import deselect_inapplicable  # deferred: a guest plugin

        deselect_inapplicable(config, items, state(config).implementation)


def pytest_report_collectionfinish(config, items):
    if not state(config).in_use or not any("mla_fuse_impl" in getattr(item, "fixturenames", ()) for item in items):
        return None
    from hypothesis import settings  # deferred: a guest plugin

    from mla_fuse_conformance.cases import sizes  # deferred: a guest plugin
    from mla_fuse_conformance.contract.implementation import resolve_spec  # deferred: a guest plugin
    from mla_fuse_conformance.running.devices import select_device  # deferred: a guest plugin

    return (f"mla_fuse: implementation {resolve_spec(config.getoption('mla_fuse_impl'))}, hypothesis profile "
            f"{settings.get_current_profile_name()!r}, sizes "
            f"{'large' if sizes.limits() is sizes.LARGE else 'small'}, device {select_device()}")


# ---------------------------------------------------------------- fixtures and failure files of the suite


def pytest_generate_tests(metafunc):
    """A deployment property (``properties/test_deployments.py``, marked by ``mla_fuse_deployments``)
    runs once per deployment of its operation, the suite's and the user's own (the implementation's
    ``deployments`` attribute and a conftest's ``pytest_mla_fuse_deployments`` hook, checked),
    each test id the deployment's name, with the deployment's engine layout (``deployment_layout``)."""
    operation = getattr(metafunc.function, "mla_fuse_deployments", None)
    if operation is None:
        return
    # deferred: a guest plugin
    from mla_fuse_conformance.cases.deployment_cases import DEPLOYMENTS, deployment_cases, user_deployments
    from mla_fuse_conformance.contract.implementation import ImplementationError  # deferred: a guest plugin

    try:
        target = loaded_implementation(metafunc.config).target
    except ImplementationError:
        target = None  # the mla_fuse_impl fixture reports it
    try:
        theirs = user_deployments(target, metafunc.config.hook.pytest_mla_fuse_deployments(config=metafunc.config))
    except ValueError as error:
        raise pytest.UsageError(f"{metafunc.config.getoption('mla_fuse_impl') or 'the implementation'}: {error}") \
            from None
    deployments = {d.name: d for d in DEPLOYMENTS + theirs}
    cases = deployment_cases(operation, DEPLOYMENTS + theirs)
    metafunc.parametrize(("case", "deployment_layout"), [(case, deployments[name].layout) for name, case in cases.items()],
                         ids=list(cases))


@pytest.fixture(scope="session")
def mla_fuse_impl(request):
    """The implementation under test (``contract.implementation.Implementation``); each example
    is moved inside its declared capabilities before it runs."""
    start_suite(request.config)
    return loaded_implementation(request.config)


@pytest.fixture
def mla_fuse(request, mla_fuse_impl, mla_fuse_device):
    """What a property test (``@pytest.mark.mla_fuse(...)``) checks with: the ``harness.PropertyRun`` of
    the requesting test (its ``Property``, the implementation, the device, this session's recorder);
    its methods are the checks. One per test; it holds no per-example state, so hypothesis'
    ``function_scoped_fixture`` health check is suppressed for the tests that use it
    (``allow_the_property_fixture``)."""
    from mla_fuse_conformance.running.harness import PropertyRun  # deferred: a guest plugin

    current = state(request.config)
    return PropertyRun(property_of_test(current, request.function), mla_fuse_impl, mla_fuse_device,
                       current.recorder, skip_missing=True)


def property_of_test(current: SuiteState, test):
    """The ``harness.Property`` of a property test, made once per session."""
    if test not in current.properties:
        from mla_fuse_conformance.running.harness import property_of  # deferred: a guest plugin

        current.properties[test] = property_of(test)
    return current.properties[test]


def allow_the_property_fixture(item) -> None:
    """Suppress ``HealthCheck.function_scoped_fixture`` for a hypothesis test that takes ``mla_fuse``,
    on top of the settings it runs with (any profile, ours or the user's, and its own ``@settings``):
    hypothesis' pytest plugin reads them from the test in ``pytest_runtest_call``, as it does when it
    suppresses ``differing_executors`` for a parametrized test."""
    if "mla_fuse" not in getattr(item, "fixturenames", ()):
        return
    test = getattr(item.obj, "__func__", item.obj)
    if not hasattr(test, "hypothesis"):
        return
    from hypothesis import HealthCheck, settings  # deferred: a guest plugin

    current = getattr(test, "_hypothesis_internal_use_settings", None) or settings.default
    if HealthCheck.function_scoped_fixture not in current.suppress_health_check:
        test._hypothesis_internal_use_settings = settings(current, suppress_health_check=[
            *current.suppress_health_check, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="session")
def mla_fuse_device():
    """CUDA if available (xdist worker N uses GPU N % count), else the CPU; $MLA_FUSE_DEVICE overrides."""
    from mla_fuse_conformance.running.devices import select_device  # deferred: a guest plugin

    return select_device()


def pytest_fixture_post_finalizer(fixturedef, request):
    """HypoFuzz enters a test again after tearing its fixtures down (``running/reentry.py``)."""
    from mla_fuse_conformance.running.reentry import forget_finalized_fixture  # deferred: a guest plugin

    forget_finalized_fixture(fixturedef, request)


def pytest_runtest_setup(item):
    allow_the_property_fixture(item)
    current = state(item.config)
    if current.recorder is not None:
        current.recorder.reset()
        current.recorder.nodeid = item.nodeid


@pytest.hookimpl(tryfirst=True)  # after hypothesis' own hook wrapper has set its key
def pytest_runtest_call(item):
    if state(item.config).in_use and "mla_fuse" in getattr(item, "fixturenames", ()):
        from mla_fuse_conformance.settings.database import key_by_suite_node_id  # deferred: a guest plugin

        marks = [mark for mark in item.iter_markers("mla_fuse")]
        # one example-database key per property, the key HypoFuzz uses (and its key in the wrapper layout)
        key_by_suite_node_id(item, bool(marks[0].kwargs.get("bad_input")) if marks and marks[0].args else None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not state(item.config).in_use:
        return
    from hypothesis import settings  # deferred: a guest plugin

    from mla_fuse_conformance.running import recording  # deferred: a guest plugin
    from mla_fuse_conformance.settings import profiles  # deferred: a guest plugin

    recorder = state(item.config).recorder
    if recorder is None or recorder.stats is None:
        return  # not an example of the suite

    failure_file = failure = None
    if report.failed and recorder.last_failure is not None:
        from mla_fuse_conformance.running import failure_text  # deferred: a guest plugin

        # the case hypothesis reported (its first, where it reported several), not the last that failed
        found = failure_text.reported(call.excinfo.value if call.excinfo is not None else None)
        failure = dict(found[0], reported_failures=len(found)) if found else recorder.last_failure
        if call.excinfo is not None and call.excinfo.typename in ("FlakyFailure", "Flaky"):  # not a plain failure
            failure = dict(failure, kind=f"did not reproduce: {failure.get('kind')} once, passed when hypothesis "
                                         "ran it again")
        if any(profiles.SLOW_SHRINK_STOP in text for _, text in report.sections):
            failure = dict(failure, shrinking=f"cut short after {profiles.shrink_seconds():g} s: the case is the "
                                              "smallest hypothesis had found by then")
        profile = settings.get_current_profile_name()
        failure_file = recording.save_failure(failure, item.nodeid, profile)
        report.sections.append(("mla_fuse: reproduce this failure",
                                recording.describe_failure(failure, failure_file, item.nodeid, profile)))
    # read by SessionReport.pytest_runtest_logreport (on the xdist controller too)
    report.user_properties.append(("mla_fuse_metrics", recorder.stats.as_record(report.outcome)))
    if failure_file is not None:
        report.user_properties.append(("mla_fuse_failure", dict(failure, file=str(failure_file))))
