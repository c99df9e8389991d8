"""Declaring properties, and the three ways a property checks an implementation.

``@prop(operations, cases=strategy)`` turns a body ``(impl, device, case)`` into a
hypothesis test and registers it in ``PROPERTIES``, so the same body runs under pytest,
from a saved failure (``repro.py``) and against every mutant (``tests/test_mutants.py``).
The wrapper skips implementations that lack an operation, notes the case, records
events for ``--hypothesis-show-statistics``, and keeps the last failing case.

The checks:

* ``against_reference``: run one operation and compare the whole memory image with
  ``oracle.expect`` under CONTRACT §5.
* ``fused_equals_unfused``: the fused operation and the same implementation's
  ``rotary_embedding`` + cache write leave bitwise equal caches.
* ``rejects_bad_input``: a corrupted call raises ValueError/TypeError naming the
  argument, and no byte of any buffer changed.
"""

from __future__ import annotations

import contextlib
import importlib
import dataclasses
import os
import re
from typing import Callable

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from hypothesis import event as hypothesis_event
from hypothesis import note as hypothesis_note
from hypothesis import target as hypothesis_target
from hypothesis.errors import InvalidArgument

from mla_fuse_conformance.contract.operations import OPERATION_ARGUMENTS
from mla_fuse.validation import CHECK_VALUES_ENV_VAR
from mla_fuse_conformance.cases import tensors as builder
from mla_fuse_conformance.judging import comparisons
from mla_fuse_conformance.cases import corruptions
from mla_fuse_conformance.judging import oracle
from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.cases.types import BadInputCase, FlashCase, MlaCase
from mla_fuse_conformance.cases.features import features
from mla_fuse_conformance.running.recording import RECORDER


# The suite builds one buffer per name; the fused MLA op calls its scale buffer kv_cache_scale.
BUFFER_OF_ARGUMENT = {"kv_cache_scale": "scale"}


# ---------------------------------------------------------------- hypothesis calls that also work in a replay


def note(text: str) -> None:
    with contextlib.suppress(InvalidArgument):
        hypothesis_note(text)


def event(text: str) -> None:
    with contextlib.suppress(InvalidArgument):
        hypothesis_event(text)


def target(value: float, label: str) -> None:
    with contextlib.suppress(InvalidArgument):
        hypothesis_target(value, label=label)


# ---------------------------------------------------------------- registry


class NotProvided(Exception):
    """The implementation lacks an operation (or a declaration) the property needs."""


class RequiredOperationMissing(AssertionError):
    """An operation the implementation must provide (``required``, ``--require``) is missing: a failure."""


ROPE_OPERATIONS = {"rotary_embedding", "concat_and_cache_mla_rope_fused", "rope_and_reshape_and_cache_flash"}


@dataclasses.dataclass(frozen=True)
class Property:
    name: str  # "test_module:function", stable across runs and installs
    operations: tuple[str, ...]
    strategies: tuple  # the unrestricted cases (one strategy per parametrized variant)
    body: Callable
    examples: tuple = ()
    needs_input_checks: bool = False
    examples_per_variant: int | None = None  # None: the profile's max_examples

    @property
    def rotates(self) -> bool:
        return bool(ROPE_OPERATIONS & set(self.operations))

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

    def run(self, impl, device, case, within_limits: bool = True):
        """One example, outside or inside hypothesis: skip, note, events, record a failure.
        ``within_limits=False`` runs a case outside the declared limits (the limit checks)."""
        # stats first, so that a skip is reported under this property's operations too
        stats = RECORDER.stats_for(self, impl, getattr(case, "corruption", None))
        try:
            self.check_provided(impl)
        except RequiredOperationMissing as error:
            RECORDER.failed(self, impl, device, case, error)
            raise
        if within_limits and not self.allows(impl, case):  # an explicit example outside the declared limits
            assume(False)
        stats.examples += 1
        note(f"case = {case!r}")
        for text in describe(case, self.rotates):
            event(text)
        RECORDER.starting(self, impl, device, case)
        try:
            outcome = self.body(impl, device, case)
        except corruptions.NotApplicable:
            stats.examples -= 1
            assume(False)
            raise
        except Exception as error:
            stats.failed_examples += 1
            RECORDER.failed(self, impl, device, case, error)
            raise
        finally:
            RECORDER.finished()
        return outcome


PROPERTIES: dict[str, Property] = {}
SUITE_PACKAGE = "mla_fuse_conformance"


def _property_name(body) -> str:
    """``test_module:function``: the same whether pytest imported the module from a clone
    (``property_tests.test_mla``) or from an installed suite (``mla_fuse_conformance.properties.test_mla``)."""
    return f"{body.__module__.rpartition('.')[2]}:{body.__name__}"


def property_named(name: str) -> Property:
    """The registered property ``test_module:function``, importing its module if needed."""
    module = name.partition(":")[0].rpartition(".")[2]
    short = f"{module}:{name.partition(':')[2]}"
    if short not in PROPERTIES:
        importlib.import_module(f"{SUITE_PACKAGE}.properties.{module}")
    return PROPERTIES[short]


# ---------------------------------------------------------------- the implementation of this pytest session

_SESSION: dict[str, object] = {}


def use_implementation(impl) -> None:
    """Make ``impl`` the implementation whose declared limits the pytest properties draw within
    (the suite's ``impl`` fixture calls this once per session)."""
    _SESSION["impl"] = impl


def _session_strategy(registered: Property, variant: int = 0):
    def resolve():
        if "impl" not in _SESSION:  # a property called without the suite's fixture: the whole contract
            return registered.strategies[variant]
        return registered.strategy_for(_SESSION["impl"], variant)

    return st.deferred(resolve)


def _run_or_skip(registered: Property, impl, device, case) -> None:
    try:
        registered.run(impl, device, case)
    except NotProvided as reason:
        pytest.skip(str(reason))


def _named_like(test, body):
    test.__name__, test.__qualname__, test.__doc__ = body.__name__, body.__qualname__, body.__doc__
    test.__module__ = body.__module__
    return test


def prop(*operations: str, cases, examples=()):
    """Decorate a body ``(impl, device, case)`` into a hypothesis test over ``cases`` (within the
    implementation's declared limits); each of ``examples`` (found bugs) runs first, every time."""

    def decorate(body):
        registered = Property(_property_name(body), operations, (cases,), body, tuple(examples))
        PROPERTIES[registered.name] = registered

        def test(mla_fuse_impl, mla_fuse_device, case):
            _run_or_skip(registered, mla_fuse_impl, mla_fuse_device, case)

        test = given(case=_session_strategy(registered))(_named_like(test, body))
        for case in reversed(registered.examples):
            test = example(case=case)(test)
        return test

    return decorate


def bad_input_prop(operation: str, examples_per_corruption: int):
    """The bad-input property of ``operation``: one pytest parameter per corruption, so every
    corruption runs in every profile, each with ``examples_per_corruption`` drawn base cases
    (more under profiles with more examples: 1/25 of their ``max_examples``)."""
    names = sorted(corruptions.CORRUPTIONS[operation])

    def decorate(body):
        variants = tuple(strategies.bad_input_cases(operation, name) for name in names)
        registered = Property(_property_name(body), (operation,), variants, body,
                              needs_input_checks=True, examples_per_variant=examples_per_corruption)
        PROPERTIES[registered.name] = registered
        bases = Property(registered.name, (operation,), (strategies.BASE_CASES[operation](),), body)

        def test(mla_fuse_impl, mla_fuse_device, corruption, base):
            _run_or_skip(registered, mla_fuse_impl, mla_fuse_device, BadInputCase(operation, corruption, base))

        test = given(base=_session_strategy(bases))(_named_like(test, body))
        # settings.default is the selected profile by now (the plugin selects it before collecting the suite)
        examples = max(examples_per_corruption, settings.default.max_examples // 25)
        test = settings(max_examples=examples)(test)
        return pytest.mark.parametrize("corruption", names)(test)

    return decorate


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


# ---------------------------------------------------------------- running operations


@contextlib.contextmanager
def value_checks(enabled: bool):
    """``MLA_FUSE_CHECK_VALUES=1`` around a call when ``enabled`` (the protocol-level switch)."""
    if not enabled:
        yield
        return
    previous = os.environ.get(CHECK_VALUES_ENV_VAR)
    os.environ[CHECK_VALUES_ENV_VAR] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[CHECK_VALUES_ENV_VAR]
        else:
            os.environ[CHECK_VALUES_ENV_VAR] = previous


def call(impl, operation: str, args: dict, check_values: bool = False) -> None:
    with value_checks(check_values):
        impl.op(operation)(*(args[BUFFER_OF_ARGUMENT.get(name, name)] for name in OPERATION_ARGUMENTS[operation]))


def _count_padding(case) -> None:
    stats = RECORDER.stats
    slots = getattr(case, "slots", None)
    if stats is not None and slots is not None and (slots.padding != "none" or slots.length < case.tokens):
        stats.padded_slot_cases += 1


def against_reference(impl, device, case, operation: str) -> comparisons.Outcome:
    """Run ``operation`` once; the whole memory image must match the reference under §5."""
    built = builder.build(case, device)
    expectation = oracle.expect(operation, built, impl)
    saturated = oracle.saturated_fraction(expectation)
    target(saturated, "fraction of fp8 codes saturated")
    if saturated:
        event("fp8 saturation")
        RECORDER.stats.saturation_cases += 1
    _count_padding(case)
    call(impl, operation, built.args, getattr(case, "check_values", False))
    outcome = comparisons.compare(built.buffers, {n: b.flat for n, b in built.buffers.items()}, expectation)
    RECORDER.observe(outcome)  # failing examples count too
    target(outcome.worst_rope_bound_fraction, "worst rotated-value error / bound")
    return comparisons.raise_failures(outcome)


UNFUSED_CHAINS = {  # fused op -> (cache op, query, key, caches)
    "concat_and_cache_mla_rope_fused": ("concat_and_cache_mla", "q_pe", "k_pe", ("kv_cache",)),
    "rope_and_reshape_and_cache_flash": ("reshape_and_cache_flash", "query", "key", ("key_cache", "value_cache")),
}


def fused_equals_unfused(impl, device, case, fused: str) -> None:
    """Fused op vs the same implementation's rotary_embedding + cache write: caches bitwise equal."""
    cache_op, query, key, cache_args = UNFUSED_CHAINS[fused]
    fused_run, chain_run = builder.build(case, device), builder.build(case, device)
    _count_padding(case)
    call(impl, fused, fused_run.args, case.check_values)
    args = chain_run.args
    head_size = args[key].size(-1)
    call(impl, "rotary_embedding", dict(args, query=args[query], key=args[key], head_size=head_size))
    call(impl, cache_op, args, case.check_values)
    caches = {name: fused_run.buffers[name].flat for name in {fused_run.view_buffer[arg] for arg in cache_args}}
    comparisons.assert_buffers_equal(
        chain_run.buffers, caches, {name: chain_run.buffers[name].flat for name in caches},
        f"{fused} and the same implementation's rotary_embedding + {cache_op} wrote different caches "
        "(got: fused; expected: unfused chain)")


def rejects_bad_input(impl, device, case: BadInputCase) -> None:
    """The corrupted call raises ValueError/TypeError naming the argument and changes nothing.

    Value checks are on by default here; a rule that needs no sync must also hold with them
    off. When the implementation's operation carries ``custom_op`` (the entry point compiled
    graphs call, skipping the wrapper: ``torch.ops.mla_fuse.*`` for ours), it is called too.
    """
    built = builder.build(case.base, device)
    corrupted = corruptions.corrupt(case.operation, case.corruption, built)
    before = built.snapshot()
    extra = {name: value.clone() for name, value in corrupted.args.items()
             if isinstance(value, torch.Tensor) and value is not built.args.get(name) and value.device.type != "meta"}
    wrapper = impl.op(case.operation)
    entry_points = {"": wrapper}
    if corrupted.direct and getattr(wrapper, "custom_op", None) is not None:
        entry_points[f" through {wrapper.custom_op} (the entry point compiled graphs call)"] = wrapper.custom_op
    arguments = [corrupted.args[BUFFER_OF_ARGUMENT.get(name, name)] for name in OPERATION_ARGUMENTS[case.operation]]
    runs = [(entry, function, check_values) for entry, function in entry_points.items()
            for check_values in ((True,) if corrupted.check_values else (True, False))]
    for entry, function, check_values in runs:
        how = f"{entry} with value checks {'on' if check_values else 'off'}"
        try:
            with value_checks(check_values):
                function(*arguments)
        except (ValueError, TypeError) as error:
            message = str(error)
            named = [name for name in corrupted.names if re.search(rf"\b{re.escape(name)}\b", message)]
            assert named, (f"{case.operation} rejected '{case.corruption}'{how} but the message names none of "
                           f"{corrupted.names}: {message!r}")
        except Exception as error:  # noqa: BLE001 - any other failure is the finding
            raise AssertionError(f"{case.operation} with '{case.corruption}'{how} raised {type(error).__name__} "
                                 f"instead of ValueError/TypeError naming {corrupted.names}: {error}") from error
        else:
            raise AssertionError(f"{case.operation} accepted bad input '{case.corruption}'{how} "
                                 f"(expected ValueError/TypeError naming one of {corrupted.names})")
        comparisons.assert_buffers_equal(built.buffers, {n: b.flat for n, b in built.buffers.items()}, before,
                                         f"{case.operation} wrote before rejecting '{case.corruption}'{how}")
        for name, clone in extra.items():
            assert torch.equal(comparisons.memory.bits(corrupted.args[name]).cpu(),
                               comparisons.memory.bits(clone).cpu()), \
                f"{case.operation} wrote to argument '{name}' before rejecting '{case.corruption}'{how}"
