"""Every conjunct of a cell shown necessary, measured (``conformance_map/necessity.py``): cases
meeting the other conjuncts but not this one must fail measurably less often, else the conjunct is
dropped; where no such case can be drawn it is kept and marked "not shown needed"."""

from __future__ import annotations

from mla_fuse_conformance.commands.conformance_map.diagnosis import Diagnosis
from mla_fuse_conformance.commands.conformance_map.necessity import (DROPPED, NEEDED, UNCONFIRMED, check_conjuncts,
                                                                      fails_less_often, negated)

SIGN = ["relation", "a value below -240 x scale", "yes"]
ROTARY = ["field-not", "rotary_dim", ["2"]]
MIDPOINT = ["field", "values.midpoint_fraction", ["0"]]


def fake_rates(needed: list, undrawable: tuple = ()):
    """``measure`` for a kernel that fails exactly where every ``needed`` conjunct holds: cases with a
    needed conjunct negated pass (0/12), any other condition fails 12/12; a condition negating an
    ``undrawable`` conjunct draws nothing (0/0)."""
    calls = []

    def measure(prop, impl, strategy, run_example, condition, failing_case, **members):
        calls.append(condition)
        if any(negated(c) in condition for c in undrawable):
            return [0, 0], None
        return ([0, 12] if any(negated(c) in condition for c in needed) else [12, 12]), None
    return measure, calls


def diagnosis_of(condition):
    return Diagnosis(fields=[], relations={}, condition=list(condition), rate=[12, 12])


def test_a_conjunct_the_failure_does_not_need_is_dropped_and_the_trigger_kept():
    """The issue's cell: `rotary_dim not 2; values.midpoint_fraction 0` beside the real trigger (a
    large negative value): the two false conjuncts go, the sign stays."""
    diagnosis = diagnosis_of([ROTARY, MIDPOINT, SIGN])
    measure, _ = fake_rates(needed=[SIGN])
    check_conjuncts(None, None, None, None, diagnosis, None, measure_rate=measure)
    assert diagnosis.condition == [SIGN] and diagnosis.rate == [12, 12]
    assert [entry["verdict"] for entry in diagnosis.necessity] == [DROPPED, DROPPED, NEEDED]
    assert diagnosis.describe() == "a value below -240 x scale: yes"


def test_a_conjunct_no_case_outside_could_be_drawn_for_is_kept_and_marked():
    diagnosis = diagnosis_of([SIGN, MIDPOINT])
    measure, _ = fake_rates(needed=[SIGN], undrawable=(MIDPOINT,))
    check_conjuncts(None, None, None, None, diagnosis, None, measure_rate=measure)
    assert diagnosis.condition == [SIGN, MIDPOINT]
    assert [entry["verdict"] for entry in diagnosis.necessity] == [NEEDED, UNCONFIRMED]
    assert "values.midpoint_fraction 0 (not shown needed)" in diagnosis.describe()


def test_every_needed_conjunct_stays():
    diagnosis = diagnosis_of([SIGN, ROTARY])
    measure, calls = fake_rates(needed=[SIGN, ROTARY])
    check_conjuncts(None, None, None, None, diagnosis, None, measure_rate=measure)
    assert diagnosis.condition == [SIGN, ROTARY] and len(calls) == 2  # one measurement per conjunct, no re-rate


def test_the_test_asks_for_a_measurable_difference():
    assert fails_less_often([12, 12], [0, 12]) < 0.001
    assert fails_less_often([12, 12], [8, 12]) < 0.05 < fails_less_often([12, 12], [9, 12])
    assert fails_less_often([6, 12], [6, 12]) > 0.5


def test_a_precondition_no_case_outside_could_be_drawn_for_is_kept_unmarked():
    written = ["relation", "some slot written (slot >= 0)", "yes"]
    diagnosis = diagnosis_of([SIGN, written])
    measure, _ = fake_rates(needed=[SIGN], undrawable=(written,))
    check_conjuncts(None, None, None, None, diagnosis, None, measure_rate=measure)
    assert [entry["verdict"] for entry in diagnosis.necessity] == [NEEDED, "precondition"]
    assert "not shown needed" not in diagnosis.describe() and written in diagnosis.condition


def test_a_conjunct_too_few_cases_outside_could_not_show_needed_is_kept_and_marked():
    """SGLang's short slot mapping: `slot_mapping length == tokens: no` found by the diagnosis, then one
    case outside it drawn (0 of 1 failing): p = 1/13, so no outcome of that one case could show the
    conjunct needed; it is kept, marked, not dropped (dropped, the cell no longer named its trigger)."""
    short = ["relation", "slot_mapping length == tokens", "no"]
    diagnosis = diagnosis_of([short, SIGN])

    def measure(prop, impl, strategy, run_example, condition, failing_case, **members):
        if negated(short) in condition:
            return [0, 1], None
        return ([0, 12] if negated(SIGN) in condition else [12, 12]), None
    check_conjuncts(None, None, None, None, diagnosis, None, measure_rate=measure)
    assert [entry["verdict"] for entry in diagnosis.necessity] == [UNCONFIRMED, NEEDED]
    assert diagnosis.condition == [short, SIGN]
    assert "slot_mapping length == tokens: no (not shown needed)" in diagnosis.describe()
    assert fails_less_often([12, 12], [0, 1]) == 1 / 13 and fails_less_often([12, 12], [0, 2]) < 0.05
