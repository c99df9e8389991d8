"""A cell holds at every value it admits (the diagnosis' step after ``necessity.py``; docs/REPORT.md "cells").

The conjuncts of a cell come from moving the failing case along its fields and from random cases
inside and outside it: a value that passes on its own can hide in a wide conjunct (``fp8 cache:
yes`` admits a scale of 1, where a kernel that multiplies by the scale instead of dividing writes
the right codes). Before the cell is reported, the failing case is moved to each value the
condition admits (``admits.py``) on every feature axis (``Axis.set``, the rest of the case the
same) and run with ``SEEDS`` seeds; a value at which every one of them passes is excluded: the
condition gains ``["axis-not", AXIS, [VALUES]]`` (``scale not 1``). Value relations are moved the
same way: a failing case with some negative written value is run with every value made
non-negative (``ValueSpec.sign``), and where that passes the condition gains ``a written value
negative: yes``; likewise the positive values. Each exclusion is recorded in ``necessity`` with
the verdict ``excluded`` and the values' runs; the cell's failure rate is then measured again
inside the narrowed condition and its ``admits`` read again. The kernels' cases only (``KERNEL_CASES``).
Two cells of a map that one defect split are joined the same way (``joined``, ``join_split_cells``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from mla_fuse_conformance.cases.features import AXIS, features
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase
from mla_fuse_conformance.commands.conformance_map.admits import admitted
from mla_fuse_conformance.commands.conformance_map.diagnosis import (SEEDS, Diagnosis, _base, inside, measure, outcome,
                                                                     relations_of)
from mla_fuse_conformance.commands.conformance_map.identity import kind_family
from mla_fuse_conformance.commands.conformance_map.necessity import LEVEL, fails_less_often

EXCLUDED = "excluded"
# the kinds of case checked: a bad-input case's failure is its corruption's (moving its base says nothing
# of it), and a compile-pass case compiles a graph per run (about 12 s on a CPU): not checked yet
KERNEL_CASES = (RopeCase, MlaCase, FlashCase)
# a value relation, the ValueSpec sign that makes it false of every written value, and the relation's failing value
SIGN_MOVES = (("a written value negative", "non-negative"), ("a written value positive", "non-positive"))


def with_sign(case, sign: str):
    """``case`` with every input value of sign ``sign`` (``ValueSpec.sign``: the activations' magnitudes kept)."""
    moved = dataclasses.replace(case, values=dataclasses.replace(case.values, sign=sign))
    if getattr(case, "value_values", None) is not None:
        moved = dataclasses.replace(moved, value_values=dataclasses.replace(case.value_values, sign=sign))
    return moved


def passes_every_seed(prop, impl, run_example: Callable, case) -> bool:
    """Whether ``case`` (None: no case) passes with its own seed and ``SEEDS - 1`` others: a value is only
    needed by a failure (``property_map.failing_cell``), or excluded from a cell, if the case moved to it
    passes whatever the data (a NaN that happens to hide the one wrong element must not decide it)."""
    if case is None:
        return False
    for offset in range(SEEDS):
        reseeded = dataclasses.replace(case, seed=(case.seed + offset) % 2 ** 32)
        if not prop.allows(impl, reseeded) or outcome(run_example, reseeded) is not False:
            return False
    return True


def exclude_passing_values(prop, impl, strategy, run_example: Callable, diagnosis: Diagnosis, case,
                           needed: dict[str, str]) -> None:
    """Move ``case`` (the cell's failing case) to each value ``diagnosis`` admits, exclude those where
    it passes (module docstring), and measure the narrowed cell again."""
    base = _base(case)
    if base is not case or not isinstance(base, KERNEL_CASES):
        return
    own = features(base, prop.rotates)
    excluded: list[dict] = []
    for name, values in (diagnosis.admits or {}).items():
        passing = [value for value in values if value != own.get(name)
                   and passes_every_seed(prop, impl, run_example, AXIS[name].set(base, value))]
        if passing:
            excluded.append({"conjunct": ["axis-not", name, passing], "verdict": EXCLUDED, "moved_to": passing})
    before = list(diagnosis.condition)
    _check_signs(prop, impl, run_example, diagnosis, base, excluded)
    if not excluded and diagnosis.condition == before:
        return
    shown = [entry["conjunct"] for entry in excluded]
    diagnosis.condition = diagnosis.condition + [c for c in shown if c not in diagnosis.condition]
    diagnosis.necessity = [entry for entry in diagnosis.necessity or () if entry["conjunct"] not in shown] + excluded
    if not inside(diagnosis.condition, base):  # cannot happen: every exclusion is a value the case does not have
        raise AssertionError(f"the failing case left its own cell: {diagnosis.condition}")
    rate, _ = measure(prop, impl, strategy, run_example, diagnosis.condition, case)
    if rate[1]:
        diagnosis.rate = rate
    diagnosis.admits = admitted(prop, impl, case, diagnosis.condition, needed)


def _check_signs(prop, impl, run_example: Callable, diagnosis: Diagnosis, base, excluded: list[dict]) -> None:
    """The sign relations (``SIGN_MOVES``) the failing case has, each told by moving the case's values
    off it: where that passes, the relation is the condition's (added, or an unconfirmed one
    confirmed: ``excluded`` gets the entry); where it still fails, an unconfirmed one is dropped (on
    random data ``a written value negative`` holds wherever something is written)."""
    if not hasattr(base, "values"):
        return
    relations = relations_of(base) or {}
    unconfirmed = [entry["conjunct"] for entry in diagnosis.necessity or () if entry["verdict"] == "unconfirmed"]
    for relation, sign in SIGN_MOVES:
        conjunct = ["relation", relation, "yes"]
        if relations.get(relation) is not True:
            continue
        present = conjunct in diagnosis.condition
        if present and conjunct not in unconfirmed:
            continue
        needed = passes_every_seed(prop, impl, run_example, with_sign(base, sign))
        if needed:
            excluded.append({"conjunct": conjunct, "verdict": EXCLUDED, "moved_to": [f"values {sign}"]})
        elif present:
            diagnosis.condition = [c for c in diagnosis.condition if c != conjunct]
            diagnosis.forget_relation(relation)
            diagnosis.necessity = [dict(entry, verdict="dropped", moved_to=[f"values {sign}"])
                                   if entry["conjunct"] == conjunct else entry for entry in diagnosis.necessity]


def _admits_every_value(admits: dict[str, list[str]] | None, values: dict[str, str]) -> bool:
    return admits is not None and all(values[axis] in admitted_values for axis, admitted_values in admits.items()
                                      if axis in values)


def joined(prop, impl, strategy, run_example: Callable, first: tuple[Diagnosis, object, dict[str, str]],
           second: tuple[Diagnosis, object, dict[str, str]]) -> Diagnosis | None:
    """One cell for two cells of a map (each ``(diagnosis, failing case, needed feature values)``) that
    one defect split (``one bug, one defect``), or None where they are two. They are one where each
    admits every feature value of the other's failing case (their conditions differ only by values
    the other admits: ``scale.mantissa not 1`` and ``scale.log2 not 0`` both admit ``scale other``):
    the joined cell is the conjuncts they share, narrowed by ``exclude_passing_values`` from the
    first's failing case (``scale not 1``), kept where both failing cases lie inside it and it fails
    no measurably less often than the first cell (``necessity.fails_less_often``)."""
    (one, case, needed), (other, other_case, _) = first, second
    if not (isinstance(case, KERNEL_CASES) and isinstance(other_case, KERNEL_CASES)):
        return None
    if not (_admits_every_value(one.admits, features(_base(other_case), prop.rotates))
            and _admits_every_value(other.admits, features(_base(case), prop.rotates))):
        return None
    common = [conjunct for conjunct in one.condition if conjunct in other.condition]
    names = {c[1] for c in common if c[0] == "relation"}
    shown = {finding.field for finding in one.fields}
    cell = Diagnosis(fields=one.fields + [f for f in other.fields if f.field not in shown],
                     relations={name: value for name, value in one.relations.items() if name in names},
                     condition=common, tried=one.tried + other.tried, dropped=min(one.dropped, other.dropped),
                     necessity=[entry for entry in one.necessity or () if entry["conjunct"] in common])
    cell.admits = admitted(prop, impl, case, common, needed)
    exclude_passing_values(prop, impl, strategy, run_example, cell, case, needed)
    if not (inside(cell.condition, _base(case)) and inside(cell.condition, _base(other_case))):
        return None
    cell.rate, _ = measure(prop, impl, strategy, run_example, cell.condition, case)
    if not cell.rate[1] or not one.rate or not one.rate[1] or fails_less_often(one.rate, cell.rate) < LEVEL:
        return None
    cell.admits = admitted(prop, impl, case, cell.condition, needed)
    return cell


def join_split_cells(prop, impl, strategy, run_example: Callable, cells: list, cases: list,
                     on_step: Callable[[str], None]) -> None:
    """Cells of a map (``property_map.Cell``; ``cases``: the failing case of each) that the rounds found
    apart, of one defect (``joined``), given one diagnosis: one title, so one entry
    (``PropertyMap.merged``, report.json), each keeping its replay file."""
    for later in range(1, len(cases)):
        for earlier in range(later):
            first, second = cells[earlier], cells[later]
            if (first.diagnosis is None or second.diagnosis is None or first.diagnosis is second.diagnosis
                    or kind_family(first.kind) != kind_family(second.kind)):
                continue
            on_step(f"cells {earlier + 1} and {later + 1}: one defect?")
            one = joined(prop, impl, strategy, run_example,
                         (Diagnosis.from_dict(first.diagnosis), cases[earlier], first.features),
                         (Diagnosis.from_dict(second.diagnosis), cases[later], second.features))
            if one is not None:
                shared, before = dataclasses.asdict(one), first.diagnosis  # cells joined before share ``before``
                for cell in cells[:later + 1]:
                    if cell.diagnosis is before or cell is second:
                        cell.diagnosis = shared
                break
