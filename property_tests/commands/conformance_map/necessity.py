"""Each conjunct of a cell shown necessary, measured (the diagnosis' last step; docs/REPORT.md "cells").

A cell's failure rate measures that its conjunction suffices. A conjunct comes from moving one
failing case along one field: a value is kept when the moved case passes, which can be the data
moving rather than the trigger (moving ``rotary_dim`` draws other values, and none of them is the
large negative one that fails). So each conjunct is checked on random cases that meet every other
conjunct but not this one (the conjunct negated: ``field`` <-> ``field-not``, a relation's ``yes``
<-> ``no``). It is *needed* when those cases fail less often than the cases inside the cell, by a
one-sided Fisher exact test at ``LEVEL`` (12 inside all failing: 4 or more of 12 outside passing);
it is *dropped* when they fail as often (the cell widens; its rate is measured again); it is
*unconfirmed* when no case outside it could be drawn (kept, and marked so in the cell's text).
Conjuncts are checked one at a time, each against the condition the ones before left.
"""

from __future__ import annotations

import math
from typing import Callable

from mla_fuse_conformance.commands.conformance_map.diagnosis import Diagnosis, measure

LEVEL = 0.05  # the one-sided p-value below which the outside failing less often is taken as shown
NEEDED, DROPPED, UNCONFIRMED = "needed", "dropped", "unconfirmed"


def negated(conjunct: list) -> list:
    kind, name, value = conjunct
    if kind == "relation":
        return ["relation", name, "no" if value == "yes" else "yes"]
    return ["field-not" if kind == "field" else "field", name, value]


def fails_less_often(inside: list[int], outside: list[int]) -> float:
    """One-sided Fisher exact p-value that the outside cases fail less often than the inside ones
    (``[failing, tried]`` each): the chance, the margins fixed, of ``inside[0]`` or more failing inside."""
    (a, n1), (c, n2) = inside, outside
    failing, total = a + c, n1 + n2
    return sum(math.comb(n1, k) * math.comb(n2, failing - k) for k in range(a, min(n1, failing) + 1)
               if failing - k <= n2) / math.comb(total, failing)


def check_conjuncts(prop, impl, strategy, run_example: Callable, diagnosis: Diagnosis, failing_case,
                    measure_rate: Callable = measure) -> None:
    """Check each conjunct of ``diagnosis.condition`` (module docstring); record the verdicts in
    ``diagnosis.necessity`` and narrow ``condition`` and ``rate`` to what was shown."""
    if not diagnosis.rate or not diagnosis.rate[1] or len(diagnosis.condition) < 1:
        return
    checked, condition, inside = [], list(diagnosis.condition), list(diagnosis.rate)
    for conjunct in list(condition):
        others = [c for c in condition if c is not conjunct]
        outside, _ = measure_rate(prop, impl, strategy, run_example, others + [negated(conjunct)], failing_case)
        if not outside[1]:
            verdict = UNCONFIRMED
        elif fails_less_often(inside, outside) < LEVEL:
            verdict = NEEDED
        else:
            verdict = DROPPED
        checked.append({"conjunct": conjunct, "inside": inside, "outside": outside, "verdict": verdict})
        if verdict == DROPPED and others:
            condition = others
            inside, _ = measure_rate(prop, impl, strategy, run_example, condition, failing_case)
    diagnosis.necessity = checked
    if condition != diagnosis.condition:
        diagnosis.condition, diagnosis.rate = condition, inside


def unconfirmed(diagnosis: Diagnosis) -> list[list]:
    """The conjuncts of the condition no case outside could be drawn for."""
    return [entry["conjunct"] for entry in diagnosis.necessity or () if entry["verdict"] == UNCONFIRMED
            and entry["conjunct"] in diagnosis.condition]
