"""What a property is, and how one example of it runs, under pytest or outside it.

A property is a plain hypothesis test in ``properties/``, marked with the operations it checks::

    @pytest.mark.mla_fuse("concat_and_cache_mla")
    @examples(FOUND + EDGES)
    @given(case=strategies.mla_cases(fused=False))
    def test_mla_cache_write_matches_reference(mla_fuse, case):
        mla_fuse.against_reference(case, "concat_and_cache_mla")

``mla_fuse`` (the plugin's fixture) is a ``PropertyRun``: the implementation under test, the
device, and the recorder of this session, bound to the property. Each check
(``running/checks.py``) runs through ``PropertyRun.example``, which skips an implementation that
lacks an operation, moves the case inside the implementation's declared limits, notes the case,
records events for ``--hypothesis-show-statistics``, saves the example before it runs and keeps
the last failing case.

Outside pytest (``mla-fuse repro``, the conformance map, the mutation self-test)
``property_named("test_mla:test_fused_mla_matches_reference")`` gives the ``Property`` of a test:
its operations, strategies and explicit examples, and ``Property.run`` runs one case through the
test's own body (``test.hypothesis.inner_test``) with a ``PropertyRun`` of the caller's.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

import pytest
from hypothesis import assume, example, settings
from hypothesis.errors import UnsatisfiedAssumption

from mla_fuse_conformance.cases import corruptions, strategies
from mla_fuse_conformance.cases.features import features
from mla_fuse_conformance.cases.types import BadInputCase, FlashCase, MlaCase
from mla_fuse_conformance.declarations.operations import ROTATING_OPERATIONS
from mla_fuse_conformance.declarations.property_modules import KERNEL_PROPERTY_MODULES, qualified
from mla_fuse_conformance.running import checks
from mla_fuse_conformance.running.events import event, note
from mla_fuse_conformance.running.interpreter_watch import TooSlowUnderInterpreter
from mla_fuse_conformance.running.recording import Recorder

MARK = "mla_fuse"  # @pytest.mark.mla_fuse(*operations, bad_input=False)


def examples(cases):
    """``@example(case=...)`` for each of ``cases`` (found bugs, edge cases: they run first, every
    time), kept on the test as ``mla_fuse_examples`` for runs outside pytest."""

    def decorate(test):
        for case in reversed(list(cases)):  # hypothesis runs the outermost @example first
            test = example(case=case)(test)
        test.mla_fuse_examples = tuple(cases)
        return test

    return decorate


# ---------------------------------------------------------------- properties


class NotProvided(Exception):
    """The implementation lacks an operation (or a declaration) the property needs."""


class RequiredOperationMissing(AssertionError):
    """An operation the implementation must provide (``required``, ``--mla-fuse-require``) is missing: a failure."""


@dataclasses.dataclass(frozen=True)
class Property:
    name: str  # "test_module:function", stable across runs and installs
    operations: tuple[str, ...]
    strategies: tuple  # the unrestricted cases (one strategy per parametrized variant)
    body: Callable  # the test's inner function: (mla_fuse, case) or (mla_fuse, corruption, base)
    examples: tuple = ()
    needs_input_checks: bool = False  # a bad-input property (parametrized by corruption)
    examples_per_variant: int | None = None  # None: the profile's max_examples
    timeout_factor: int = 1  # an example may take this many times $MLA_FUSE_EXAMPLE_TIMEOUT (compiling ones)

    @property
    def rotates(self) -> bool:
        return bool(set(ROTATING_OPERATIONS) & set(self.operations))

    def project(self, impl, case, capabilities=None):
        """``case`` moved inside what ``impl`` declares for every operation of the property (or
        inside ``capabilities``), or None where it cannot be (the example is rejected)."""
        base = case.base if isinstance(case, BadInputCase) else case
        for operation in self.operations:
            if base is None:
                return None
            caps = capabilities if capabilities is not None else impl.caps(operation)
            base = caps.project(base, self.rotates)
        if base is None or not isinstance(case, BadInputCase):
            return base
        return dataclasses.replace(case, base=base)

    def strategy_for(self, impl, variant: int = 0, capabilities=None):
        """The cases this property draws for ``impl``: ``strategies[variant]`` moved inside its limits."""
        return (self.strategies[variant].map(lambda case: self.project(impl, case, capabilities))
                .filter(lambda case: case is not None))

    def allows(self, impl, case) -> bool:
        base = case.base if isinstance(case, BadInputCase) else case
        return all(impl.caps(operation).allows(base, self.rotates) for operation in self.operations)

    def check_provided(self, impl) -> None:
        """Raise NotProvided (skip) or RequiredOperationMissing (fail) for a missing operation."""
        missing = [op for op in self.operations if not impl.provides(op)]
        required = [op for op in missing if op in impl.required]
        if required:
            misspelled = "".join(f"; it has {attr!r}, which looks like {op!r}"
                                 for attr, op in impl.near_misses.items() if op in required)
            raise RequiredOperationMissing(f"{impl.name} does not provide the required operation "
                                           f"{', '.join(required)}{misspelled}")
        if missing:
            raise NotProvided(f"{impl.name} does not provide {', '.join(missing)}")
        if self.needs_input_checks and not impl.checks_inputs:
            raise NotProvided(f"{impl.name} declares checks_inputs=False: the bad-input rule does not apply")

    def run(self, impl, device, case, within_limits: bool = True, recorder: Recorder | None = None,
            served: str | None = None):
        """One example outside hypothesis' test runner: ``case`` through the test's own body.
        ``within_limits=False`` runs a case outside the declared limits (the limit checks); ``served``: a
        deployment of an engine layout the implementation serves, run as it is (``PropertyRun.served``)."""
        run = PropertyRun(self, impl, device, recorder or Recorder(), within_limits, served=served)
        if isinstance(case, BadInputCase):
            return self.body(run, corruption=case.corruption, base=case.base)
        return self.body(run, case=case)


@dataclasses.dataclass
class PropertyRun:
    """The implementation, device and recorder one property's examples run with (the ``mla_fuse``
    fixture under pytest); the checks of ``running/checks.py`` are its methods."""

    prop: Property
    impl: object
    device: object
    recorder: Recorder
    within_limits: bool = True
    skip_missing: bool = False  # under pytest a missing operation skips the test (else NotProvided)
    # a deployment of this engine layout, which the implementation ``serves``: the case runs as the engine
    # calls it, not moved inside the declared limits, and an exception is a failure (not a refusal)
    served: str | None = None

    def __repr__(self) -> str:
        """Short: hypothesis prints it in every falsifying example, and the property's strategies
        (hundreds of explicit cases) would fill a log; the case itself is printed beside it."""
        return f"PropertyRun({self.prop.name!r}, impl={getattr(self.impl, 'name', self.impl)!r}, device={str(self.device)!r})"

    def _repr_pretty_(self, printer, cycle) -> None:  # hypothesis' printer would list a dataclass's fields
        printer.text(repr(self))

    def example(self, case, check: Callable, *arguments):
        """Run ``check(self, case, *arguments)`` as one example of the property."""
        prop, impl, recorder = self.prop, self.impl, self.recorder
        # stats first, so that a skip is reported under this property's operations too
        stats = recorder.stats_for(prop, impl, getattr(case, "corruption", None))
        try:
            prop.check_provided(impl)
        except RequiredOperationMissing as error:
            recorder.failed(prop, impl, self.device, case, error)
            raise
        except NotProvided as reason:
            if self.skip_missing:
                pytest.skip(str(reason))
            raise
        if self.within_limits and not self.served:
            case = prop.project(impl, case)
            if case is None:
                assume(False)  # outside the declared limits: rejected (UnsatisfiedAssumption outside a test)
        stats.examples += 1
        note(f"case = {case!r}")
        for text in describe(case, prop.rotates):
            event(text)
        recorder.starting(prop, impl, self.device, case)
        try:
            return check(self, case, *arguments)
        except corruptions.NotApplicable:
            stats.examples -= 1
            assume(False)
            raise
        except TooSlowUnderInterpreter as slow:  # not judged: neither a pass nor a failure
            stats.examples -= 1
            stats.not_judged += 1
            stats.not_judged_estimate = max(stats.not_judged_estimate, slow.estimated)
            event("not judged: too slow under the interpreter")
            raise UnsatisfiedAssumption(str(slow)) from None
        except Exception as error:
            stats.failed_examples += 1
            recorder.failed(prop, impl, self.device, case, error)
            if self.served:  # the replay runs it as served too
                recorder.last_failure["served"] = self.served
            raise
        finally:
            recorder.finished()

    def against_reference(self, case, operation: str):
        return self.example(case, checks.against_reference, operation)

    def fused_equals_unfused(self, case, fused: str):
        return self.example(case, checks.fused_equals_unfused, fused)

    def rejects_bad_input(self, case: BadInputCase):
        return self.example(case, checks.rejects_bad_input)


def bad_input_examples(per_corruption: int) -> int:
    """Examples of each corruption: ``per_corruption``, more under profiles with more examples
    (1/25 of their ``max_examples``; the plugin loads the profile before the suite is imported)."""
    return max(per_corruption, settings.default.max_examples // 25)


# ---------------------------------------------------------------- finding the properties


def property_of(test) -> Property:
    """The ``Property`` of a property test (its mark, strategies, examples and body)."""
    mark = next(mark for mark in getattr(test, "pytestmark", ()) if mark.name == MARK)
    handle = test.hypothesis
    name = f"{test.__module__.rpartition('.')[2]}:{test.__name__}"
    if mark.kwargs.get("bad_input"):
        (operation,) = mark.args
        names = corruptions.names(operation)
        variants = tuple(strategies.bad_input_cases(operation, corruption) for corruption in names)
        return Property(name, (operation,), variants, handle.inner_test, needs_input_checks=True,
                        examples_per_variant=mark.kwargs.get("examples_per_corruption"))
    return Property(name, tuple(mark.args), (handle._given_kwargs["case"],), handle.inner_test,
                    tuple(getattr(test, "mla_fuse_examples", ())), timeout_factor=mark.kwargs.get("timeout_factor", 1))


def _property_name(name: str) -> tuple[str, str]:
    """``test_module:function`` from a name spelled with any package path before the module."""
    module, _, function = name.partition(":")
    return module.rpartition(".")[2], function.partition("[")[0]


def property_named(name: str) -> Property:
    """The property ``test_module:function`` (the same whether pytest imported the module from a
    clone, ``property_tests.properties.test_mla``, or from an installed suite)."""
    module, function = _property_name(name)
    return property_of(getattr(importlib.import_module(qualified(module)), function))


def all_properties() -> dict[str, Property]:
    """Every kernel property of the suite, by name."""
    found = {}
    for module in KERNEL_PROPERTY_MODULES:
        imported = importlib.import_module(qualified(module))
        for attribute, value in vars(imported).items():
            if attribute.startswith("test_") and any(m.name == MARK for m in getattr(value, "pytestmark", ())):
                prop = property_of(value)
                found[prop.name] = prop
    return found


# ---------------------------------------------------------------- events (--hypothesis-show-statistics)


def describe(case, rotates: bool = True) -> list[str]:
    """The kinds of case this example is, for hypothesis' statistics: its feature values
    (``features.py``) and a few finer distinctions that are not capabilities."""
    if isinstance(case, BadInputCase):
        return [f"bad input: {case.operation}: {case.corruption}"]
    found = [f"{axis}: {value}" for axis, value in features(case, rotates).items()]
    if rotates:
        table = case.table
        found.append(f"table: {table.style}" + (", > 4096 rows" if table.num_positions > 4096 else ""))
        found.append(f"positions: {case.positions.pattern}")
    if isinstance(case, (MlaCase, FlashCase)) and case.values.midpoint_fraction \
            and case.kv_cache_dtype.startswith("fp8"):
        found.append("values on fp8 rounding midpoints")
    if isinstance(case, FlashCase) and case.k_scale != case.v_scale:
        found.append("k_scale != v_scale")
    return found
