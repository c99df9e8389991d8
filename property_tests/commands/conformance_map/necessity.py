"""Each conjunct of a cell shown necessary, measured (the diagnosis' last step; docs/REPORT.md "cells").

A cell's failure rate measures that its conjunction suffices. A conjunct comes from moving one
failing case along one field: a value is kept when the moved case passes, which can be the data
moving rather than the trigger (moving ``rotary_dim`` draws other values, and none of them is the
large negative one that fails). So each conjunct is checked on random cases that meet every other
conjunct but not this one (the conjunct negated: ``field`` <-> ``field-not``, a relation's ``yes``
<-> ``no``). It is *needed* when those cases fail less often than the cases inside the cell, by a
one-sided Fisher exact test at ``LEVEL`` (12 inside all failing: 4 or more of 12 outside passing);
it is *dropped* when they fail as often (the cell widens; its rate is measured again); it is
*unconfirmed* when no case outside it could be drawn, or too few for the test to show it needed even had
none of them failed (one case outside against 12 failing inside: p = 1/13), kept and marked so in the
cell's text; but
for a precondition (``some slot written (slot >= 0): yes``, ``tokens > 0: yes``): outside it the
operation has nothing to do, so it is kept as a *precondition*, unmarked.
Conjuncts are checked one at a time, each against the condition the ones before left.

A needed conjunct whose outside still fails sometimes is narrower than the trigger (``x/scale
rounding past the format's max, negative`` where the defect clamps at -240: values between -448 and
-248 fail outside it). It is *widened*: replaced by a relation that holds on the failing case and
on every failing case outside it, and on no passing case outside it (``x/scale rounding below -240
(e4m3fnuz's max)``), where the cell with it does not fail measurably less often (the same test);
the relation put in its place is then checked like the others.
"""

from __future__ import annotations

import math
from typing import Callable

from mla_fuse_conformance.cases import fields as case_fields
from mla_fuse_conformance.commands.conformance_map.diagnosis import (PRECONDITIONS, Diagnosis, _base, measure,
                                                                     relations_of)
from mla_fuse_conformance.running.executor import OutOfTime

WIDEN_TRIES = 3  # replacements of a too-narrow conjunct measured, at most
LEVEL = 0.05  # the one-sided p-value below which the outside failing less often is taken as shown
NEEDED, DROPPED, UNCONFIRMED, WIDENED = "needed", "dropped", "unconfirmed", "widened"
PRECONDITION = "precondition"  # no case outside drawn, and outside it the operation writes or rotates nothing
PRECONDITION_VALUES = [[name, "yes"] for name in PRECONDITIONS]


def negated(conjunct: list) -> list:
    kind, name, value = conjunct
    if kind == "relation":
        return ["relation", name, "no" if value == "yes" else "yes"]
    return [kind.removesuffix("-not") if kind.endswith("-not") else f"{kind}-not", name, value]


def fails_less_often(inside: list[int], outside: list[int]) -> float:
    """One-sided Fisher exact p-value that the outside cases fail less often than the inside ones
    (``[failing, tried]`` each): the chance, the margins fixed, of ``inside[0]`` or more failing inside."""
    (a, n1), (c, n2) = inside, outside
    failing, total = a + c, n1 + n2
    return sum(math.comb(n1, k) * math.comb(n2, failing - k) for k in range(a, min(n1, failing) + 1)
               if failing - k <= n2) / math.comb(total, failing)


def wider(conjunct: list, own: dict | None, members: list[tuple[dict | None, bool]], fields: dict | None = None
          ) -> list[list]:
    """Conjuncts in place of ``conjunct`` that hold on the failing case (``own``: its relations;
    ``fields``: its field values) and on every failing member outside ``conjunct``, and on no passing
    one: for a field, its values with those only failing members have; else relations. Empty where
    there is no failing or no passing member to tell by."""
    failing = [relations for relations, fails in members if fails and relations is not None]
    passing = [relations for relations, fails in members if not fails and relations is not None]
    if not own or not failing or not passing:
        return []
    kind, path, value = conjunct
    if kind == "field" and fields is not None:
        failing_values = {case_fields.show(f.get(path)) for f in (m.get(FIELDS) or {} for m in failing)}
        passing_values = {case_fields.show(f.get(path)) for f in (m.get(FIELDS) or {} for m in passing)}
        more = sorted(failing_values - passing_values - set(value) - {"None"})
        return [["field", path, list(value) + more]] if more else []
    return [["relation", name, case_fields.show(own_value)] for name, own_value in own.items()
            if name != path and not name.startswith(FIELDS)
            and all(relations.get(name) == own_value for relations in failing)
            and not any(relations.get(name) == own_value for relations in passing)]


def _restored(diagnosis: Diagnosis, conjunct: list) -> list[list]:
    """The field conjuncts of the fields a dropped relation alone explained (back to conditions on
    themselves, as the diagnosis gives them where no relation explains a field)."""
    out = []
    for finding in diagnosis.fields:
        if conjunct[0] == "relation" and finding.explained_by == f"{conjunct[1]}: {conjunct[2]} fails":
            finding.explained_by = None
            out.append(["field-not", finding.field, finding.passing] if len(finding.passing) < len(finding.failing)
                       else ["field", finding.field, finding.failing])
    return out


def check_conjuncts(prop, impl, strategy, run_example: Callable, diagnosis: Diagnosis, failing_case,
                    measure_rate: Callable = measure) -> None:
    """Check each conjunct of ``diagnosis.condition`` (module docstring); record the verdicts in
    ``diagnosis.necessity`` and narrow ``condition`` and ``rate`` to what was shown (or widen a
    conjunct narrower than the trigger)."""
    if not diagnosis.rate or not diagnosis.rate[1] or len(diagnosis.condition) < 1:
        return
    checked, condition, inside = [], list(diagnosis.condition), list(diagnosis.rate)
    own = _with_fields(failing_case) if failing_case is not None else None
    pending, seen = list(condition), []
    try:
        while pending:
            conjunct = pending.pop(0)
            seen.append(conjunct)
            others = [c for c in condition if c is not conjunct]
            members: list = []
            cases: list = []
            outside, _ = measure_rate(prop, impl, strategy, run_example, others + [negated(conjunct)], failing_case,
                                      members=members, member_cases=cases)
            if not outside[1]:  # a precondition (nothing written, no token) leaves the operation nothing to do
                precondition = conjunct[0] == "relation" and conjunct[1:] in PRECONDITION_VALUES
                verdict = PRECONDITION if precondition else UNCONFIRMED
            elif fails_less_often(inside, outside) < LEVEL:
                verdict = NEEDED
            elif fails_less_often(inside, [0, outside[1]]) >= LEVEL:  # too few outside: none failing would not show it
                verdict = UNCONFIRMED
            else:
                verdict = DROPPED
            entry = {"conjunct": conjunct, "inside": inside, "outside": outside, "verdict": verdict}
            checked.append(entry)
            described = [(None if relations is None else {**relations, FIELDS: case_fields.leaves(case)}, fails)
                         for (relations, fails), case in zip(members, cases)]
            widen = verdict == NEEDED and outside[0]
            candidates = wider(conjunct, own, described, own and own.get(FIELDS)) if widen else []
            for replacement in [c for c in candidates if c not in condition and c not in seen][:WIDEN_TRIES]:
                rate, _ = measure_rate(prop, impl, strategy, run_example, others + [replacement], failing_case)
                if rate[1] and fails_less_often(inside, rate) >= LEVEL:
                    entry.update(verdict=WIDENED, to=replacement, widened_rate=rate)
                    if conjunct[0] == "relation":  # measured, not seen to separate the cases the diagnosis tried
                        diagnosis.forget_relation(conjunct[1])
                    condition = [replacement if c is conjunct else c for c in condition]
                    inside = rate
                    pending.append(replacement)
                    break
            if verdict == DROPPED and others:
                restored = [c for c in _restored(diagnosis, conjunct) if c not in others]
                condition = others + restored
                pending += restored
                inside = None  # until measured: a cut-short cell then has no rate
                inside, _ = measure_rate(prop, impl, strategy, run_example, condition, failing_case)
    except OutOfTime:  # the map's time budget (--map-seconds): the verdicts reached kept (cut_short.py)
        diagnosis.necessity, diagnosis.condition, diagnosis.rate = checked, condition, inside
        raise
    diagnosis.necessity = checked
    if condition != diagnosis.condition:
        diagnosis.condition, diagnosis.rate = condition, inside


FIELDS = "\x00fields"  # a member's field values, kept beside its relations (no relation is named so)


def _with_fields(case) -> dict | None:
    relations = relations_of(_base(case))
    return None if relations is None else {**relations, FIELDS: case_fields.leaves(_base(case))}
