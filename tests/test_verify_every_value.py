"""Every feature in every profile: each value of each feature axis that a kernel property can
reach, and the fp8-saturation and padded-slot events, is in that property's explicit examples
(``cases/every_value.py``), which run first in the ``dev`` and the ``ci`` profile alike, so a
short random run cannot miss it. Counted without running a kernel: the examples' features, and
the reference's expectation for saturation."""

from __future__ import annotations

import collections

import pytest
from hypothesis import Phase, settings

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.cases.every_value import every_value
from mla_fuse_conformance.cases.features import features
from mla_fuse_conformance.commands.report.document import applicable_values
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.declarations.operations import CACHING_OPERATIONS
from mla_fuse_conformance.judging import oracle
from mla_fuse_conformance.running.harness import all_properties
from mla_fuse_conformance.settings import profiles

MODULES = ("test_rotary_embedding", "test_mla", "test_flash")  # the properties over random cases


def kernel_properties() -> list:
    return [prop for name, prop in all_properties().items()
            if name.partition(":")[0] in MODULES and not prop.needs_input_checks]


def explicit_examples(prop, impl) -> list:
    """The property's explicit examples as ``impl`` runs them (moved inside its declared limits)."""
    return [case for case in map(lambda case: prop.project(impl, case), prop.examples) if case is not None]


def value_counts(prop, cases) -> dict[str, collections.Counter]:
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in cases:
        for axis, value in features(case, prop.rotates).items():
            counts[axis][value] += 1
    return counts


def saturates(prop, case) -> bool:
    """Whether the reference's expectation of ``case`` has a saturated fp8 code (the suite's event)."""
    built = tensors.build(case, "cpu")
    return oracle.saturated_fraction(oracle.expect(prop.operations[0], built, load_implementation("reference"))) > 0


@pytest.mark.parametrize("profile", ["dev", "ci"])
def test_the_explicit_examples_run_in_the_profile(profile):
    assert Phase.explicit in settings.get_profile(profiles.full_name(profile)).phases


@pytest.mark.parametrize("prop", kernel_properties(), ids=lambda prop: prop.name)
def test_every_reachable_value_and_event_is_in_the_explicit_examples(prop):
    impl = load_implementation("triton")  # the default implementation
    cases = explicit_examples(prop, impl)
    counts = value_counts(prop, cases)
    missing = [f"{axis} {value}" for axis, values in applicable_values(prop).items()
               for value in values if not counts[axis][value]]
    assert not missing, f"{prop.name}: no explicit example has {', '.join(missing)}"
    if set(prop.operations) & set(CACHING_OPERATIONS):
        assert any(case.slots.padding != "none" or case.slots.length < case.tokens for case in cases), \
            f"{prop.name}: no explicit example has a padded slot"
        fp8 = [case for case in cases if case.kv_cache_dtype.startswith("fp8")]
        if prop.name.endswith("_matches_reference"):  # the event is counted where the reference is compared
            assert any(saturates(prop, case) for case in fp8), f"{prop.name}: no explicit example saturates fp8"


def test_every_value_adds_what_the_examples_lack_and_nothing_when_they_have_it():
    prop = next(prop for prop in kernel_properties() if prop.name.endswith("test_mla_cache_write_matches_reference"))
    first = prop.examples[:1]
    added = every_value(first, prop.rotates)
    reached = value_counts(prop, [*first, *added])
    assert all(reached[axis][value] for axis, values in applicable_values(prop).items() for value in values)
    assert reached["NaN inputs"]["yes"] and reached["slot_mapping length"]["< T"]
    assert every_value([*first, *added], prop.rotates) == []


def fp8_reference_properties() -> list:
    return [prop for prop in kernel_properties()
            if prop.name.endswith("_matches_reference") and set(prop.operations) & set(CACHING_OPERATIONS)]


@pytest.mark.parametrize("mutant", ["mutant:fp8_nan_to_zero", "mutant:fp8_overflow_not_saturated"])
@pytest.mark.parametrize("prop", fp8_reference_properties(), ids=lambda prop: prop.name)
def test_the_explicit_examples_alone_catch_a_wrong_nan_or_saturation_code(prop, mutant):
    """The dev profile once passed a cache write that saturated NaN: its few random examples had no
    NaN with an fp8 cache. The explicit examples, run in every profile, have one."""
    impl = load_implementation(mutant)
    failed = 0
    for case in explicit_examples(prop, impl):
        try:
            prop.run(impl, "cpu", case)
        except AssertionError:
            failed += 1
    assert failed, f"no explicit example of {prop.name} catches {mutant}"
