"""A cell holds at every value it admits (``conformance_map/holds.py``; issue: "what a careful
reviewer finds", item 6): the failing case moved to each admitted value, a value where it passes
excluded (``scale not 1``); the sign moves (``a written value negative: yes``); two cells of one
defect, split by the rounds, joined into one. The kernels are fakes raising where their trigger
holds (``test_map_precision.fake_kernel``: the map's mechanics, not a kernel, in seconds)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mla_fuse_conformance.cases.types import ScaleSpec
from mla_fuse_conformance.commands.conformance_map import holds
from mla_fuse_conformance.commands.conformance_map.admits import admitted
from mla_fuse_conformance.commands.conformance_map.diagnosis import Diagnosis, inside
from mla_fuse_conformance.commands.conformance_map.necessity import negated
from mla_fuse_conformance.commands.report.defects import implies
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running.harness import property_named
from test_map_precision import MLA_WRITE, fake_kernel, moved_onto, scale_not_1, some_written, triggered, written

SLOT = ["relation", "some slot written (slot >= 0)", "yes"]
FP8 = ["relation", "fp8 cache", "yes"]
NEGATIVE = ["relation", "a written value negative", "yes"]
POSITIVE = ["relation", "a written value positive", "yes"]
NOT_SCALE_1 = ["axis-not", "scale", ["1"]]


def negative_written(case) -> bool:
    """A kernel that loses the sign: right exactly where no written value is negative."""
    return any(bool((x < 0).any()) for x in written(case))


@pytest.fixture(scope="module")
def mla():
    return property_named(MLA_WRITE), load_implementation("reference")


def cell(prop, impl, case, condition, unconfirmed=()) -> Diagnosis:
    found = Diagnosis(fields=[], relations={}, condition=list(condition), rate=[12, 12],
                      necessity=[{"conjunct": c, "verdict": "unconfirmed"} for c in unconfirmed])
    found.admits = admitted(prop, impl, case, found.condition, {})
    return found


def with_scale(case, log2: float, mantissa: float):
    return dataclasses.replace(case, scale=ScaleSpec(log2, mantissa))


def test_a_value_the_failing_case_passes_at_is_excluded(mla):
    """`fp8 cache: yes` admits a scale of 1, where the multiplied scale writes the right codes: the
    cell says `scale not 1`, and no longer admits it (the heat map leaves it green)."""
    prop, impl = mla
    case = triggered(prop, impl, scale_not_1, moved_onto("kv_cache_dtype", "fp8"), count=3)[0]
    found = cell(prop, impl, case, [SLOT, FP8])
    assert found.admits["scale"] == ["1", "other"]
    holds.exclude_passing_values(prop, impl, prop.strategy_for(impl), fake_kernel(scale_not_1), found, case, {})
    assert NOT_SCALE_1 in found.condition and "scale not 1" in found.describe()
    assert found.admits["scale"] == ["other"]
    assert {"conjunct": NOT_SCALE_1, "verdict": holds.EXCLUDED, "moved_to": ["1"]} in found.necessity
    assert found.rate[0] == found.rate[1] > 0


def test_a_value_the_failing_case_still_fails_at_stays_admitted(mla):
    """The same cell on a kernel wrong at every fp8 scale: nothing is excluded."""
    prop, impl = mla
    fp8_written = lambda case: case.kv_cache_dtype.startswith("fp8") and some_written(case)  # noqa: E731
    case = triggered(prop, impl, scale_not_1, moved_onto("kv_cache_dtype", "fp8"), count=3)[0]
    found = cell(prop, impl, case, [SLOT, FP8])
    holds.exclude_passing_values(prop, impl, prop.strategy_for(impl), fake_kernel(fp8_written), found, case, {})
    assert found.condition == [SLOT, FP8] and found.admits["scale"] == ["1", "other"]


def test_a_sign_the_failure_needs_is_shown_and_a_sign_it_does_not_is_dropped(mla):
    """On random data both sign relations hold wherever something is written, so the diagnosis
    cannot tell them from `some slot written`: moving the values off each sign tells them."""
    prop, impl = mla
    case = triggered(prop, impl, negative_written, count=3)[0]
    found = cell(prop, impl, case, [SLOT, NEGATIVE, POSITIVE], unconfirmed=[NEGATIVE, POSITIVE])
    assert "(not shown needed)" in found.describe()
    holds.exclude_passing_values(prop, impl, prop.strategy_for(impl), fake_kernel(negative_written), found, case, {})
    assert found.condition == [SLOT, NEGATIVE], found.condition
    assert found.describe() == "a written value negative: yes; some slot written (slot >= 0): yes"
    missing = cell(prop, impl, case, [SLOT])
    holds.exclude_passing_values(prop, impl, prop.strategy_for(impl), fake_kernel(negative_written), missing, case, {})
    assert missing.condition == [SLOT, NEGATIVE]


def test_two_cells_of_one_defect_are_joined_and_two_defects_are_not(mla):
    """The split the map made of the multiplied scale (rounds found `scale.mantissa not 1` and
    `scale.log2 not 0`, each false of the other's failing case): one cell, `scale not 1`. A cell of
    another defect (an e5m2 cache at scale 1) does not join it."""
    prop, impl = mla
    base = triggered(prop, impl, scale_not_1, moved_onto("kv_cache_dtype", "fp8_e4m3"), count=3)[0]
    mantissa, log2 = with_scale(base, 0.0, 1.5), with_scale(base, 1.0, 1.0)
    run = fake_kernel(scale_not_1)
    first = cell(prop, impl, mantissa, [SLOT, FP8, ["field-not", "scale.mantissa", ["1"]]])
    second = cell(prop, impl, log2, [SLOT, FP8, ["field-not", "scale.log2", ["0"]]])
    assert not inside(first.condition, log2) and not inside(second.condition, mantissa)
    one = holds.joined(prop, impl, prop.strategy_for(impl), run, (first, mantissa, {}), (second, log2, {}))
    assert one is not None and one.condition == [SLOT, FP8, NOT_SCALE_1], one and one.condition
    assert inside(one.condition, mantissa) and inside(one.condition, log2)

    e5m2_at_1 = with_scale(dataclasses.replace(base, kv_cache_dtype="fp8_e5m2"), 0.0, 1.0)
    both = lambda case: scale_not_1(case) or case.kv_cache_dtype == "fp8_e5m2" and some_written(case)  # noqa: E731
    other = cell(prop, impl, e5m2_at_1, [SLOT, ["field", "kv_cache_dtype", ["fp8_e5m2"]]])
    assert holds.joined(prop, impl, prop.strategy_for(impl), both, (first, mantissa, {}),
                        (other, e5m2_at_1, {})) is None


def test_a_feature_axis_conjunct_reads_as_the_others_do(mla):
    """``axis-not`` and its negation in ``inside``, the necessity check and a defect's implication."""
    prop, impl = mla
    case = triggered(prop, impl, scale_not_1, moved_onto("kv_cache_dtype", "fp8"), count=3)[0]
    assert inside([NOT_SCALE_1], case) and not inside([negated(NOT_SCALE_1)], case)
    assert inside([negated(NOT_SCALE_1)], with_scale(case, 0.0, 1.0))
    assert negated(negated(NOT_SCALE_1)) == NOT_SCALE_1
    entry = lambda data: {"condition": {"data": data}}  # noqa: E731
    assert implies(entry([FP8, ["axis", "scale", ["other"]]]), entry([FP8, NOT_SCALE_1]))
    assert not implies(entry([FP8]), entry([FP8, NOT_SCALE_1]))
    assert not implies(entry([["field-not", "scale", ["1"]]]), entry([NOT_SCALE_1]))


def test_values_of_one_sign_keep_their_magnitudes(mla):
    prop, impl = mla
    case = triggered(prop, impl, negative_written, count=3)[0]
    before, after = written(case), written(holds.with_sign(case, "non-negative"))
    for x, y in zip(before, after):
        assert torch.equal(x.abs().nan_to_num(), y.nan_to_num()) and not bool((y < 0).any())
