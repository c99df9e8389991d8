"""Mutation self-test of the compile-pass properties.

Every mutant of ``mla_fuse_conformance.compile_passes.mutants`` carries one "Compile passes" bug of
``docs/BUGS.md`` (and the copy-free rule). The compile-pass property suite alone
(``property_tests/properties/test_compile_passes.py``; no unit test) must catch each within the ``ci``
profile: its explicit examples, then the derandomized examples CI generates, without
shrinking. Caught means a property failed with an ``AssertionError`` or with an error type the
mutant declares (a graph the lint rejects); anything else is a broken mutant. A mutant of a graph shape
no model produces (``PassMutant.unit_test``) is run against the unit test that builds that graph instead
(the property cannot reach it; docs/PASSES.md, "Situations and graph shapes"). The time and the
number of examples to the first failure go to ``.mla_fuse_reports/mutants.jsonl`` (or
``$MLA_FUSE_REPORT_DIR``) as ``pass:<mutant>`` rows, which the suite's plugin prints as a table
at the end of the session, next to the kernel mutants'.
"""

from __future__ import annotations

import importlib
import time

import pytest
from hypothesis import Verbosity, example, given, settings

from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.compile_passes.mutants import PASS_MUTANTS
from mla_fuse_conformance.compile_passes.checks import check_compile_case
from mla_fuse_conformance.properties.test_compile_passes import CI_EXAMPLES
from mla_fuse_conformance.running.harness import property_named

COMPILE = property_named("test_compile_passes:test_passes_fuse_exactly_where_allowed_bitwise_and_copy_free")
PROPERTIES = {COMPILE.name.partition(":")[2]: (COMPILE.strategies[0], check_compile_case, COMPILE.examples)}


def hunt(strategy, check, explicit, max_examples: int):
    """Run one property like the ci profile does, stopping at the first failure:
    ``(error or None, examples run)``."""
    examples = 0

    @settings(profiles.ci_settings(max_examples=max_examples, phases=profiles.NO_SHRINK_PHASES,
                                   report_multiple_bugs=False, verbosity=Verbosity.quiet))
    @given(case=strategy)
    def run(case):
        nonlocal examples
        examples += 1
        check(case)

    for case in reversed(explicit):  # explicit examples first, in order, as under pytest
        run = example(case=case)(run)
    try:
        run()
    except Exception as error:  # noqa: BLE001  (the caller decides what counts as caught)
        return error, examples
    return None, examples


def hunt_properties() -> tuple[tuple[str, BaseException] | None, int]:
    """Each property in turn until one fails: ``((property, error) or None, examples run)``."""
    total = 0
    for prop, (strategy, check, explicit) in PROPERTIES.items():
        error, examples = hunt(strategy, check, explicit, CI_EXAMPLES)
        total += examples
        if error is not None:
            return (prop, error), total
    return None, total


def run_unit_test(spec: str) -> BaseException | None:
    """Run ``module:test`` (a test function of tests/ without arguments): what it raised, or None."""
    module, _, name = spec.partition(":")
    try:
        getattr(importlib.import_module(module), name)()
    except Exception as error:  # noqa: BLE001  (the caller decides what counts as caught)
        return error
    return None


@pytest.mark.parametrize("name", sorted(PASS_MUTANTS))
def test_pass_mutant_is_caught_by_the_properties(name, mutant_results):
    mutant = PASS_MUTANTS[name]
    start = time.perf_counter()
    with mutant.active():
        if mutant.unit_test:  # a graph shape no model produces: the unit test that builds it by hand
            total, error = 1, run_unit_test(mutant.unit_test)
            caught = None if error is None else (mutant.unit_test, error)
        else:
            caught, total = hunt_properties()
    seconds = time.perf_counter() - start
    prop, error = caught or (None, None)
    result = "MISSED" if error is None else "caught" if isinstance(error, mutant.caught_by) else "crashed"
    first_line = (str(error).splitlines() or [""])[0]
    mutant_results(dict(
        mutant=f"pass:{name}", result=result, seconds=seconds, examples=total, property=prop, bug_class=mutant.bug_class,
        message=f"{type(error).__name__}: {first_line[:200]}" if error else None, time=time.time()))
    print(f"pass mutant {name}: {result} by {prop} after {total} examples in {seconds:.1f}s"
          + (f" ({type(error).__name__}: {first_line[:160]})" if error else ""))
    judge = f"its unit test {mutant.unit_test}" if mutant.unit_test else "any compile-pass property"
    assert error is not None, f"{name} ({mutant.bug_class}) not caught by {judge} in {total} examples"
    assert isinstance(error, mutant.caught_by), f"{name} crashed the properties instead: {error!r}"
