"""The diagnosis' step 3 (``commands/conformance_map/diagnosis.py``): a cell's failure rate measured on random cases
inside it, and the cell narrowed or pruned by what those cases show.

* A *partial* cell (some cases inside pass) is narrowed by the relations that split its failing
  cases from its passing ones, where a conjunction of them does: each relation takes the value
  every failing case has (``q second half 16-byte aligned: no``), chosen greedily, the one that
  excludes most passing cases first, among equals an alignment, then another relation on addresses.
  Only where no conjunction splits them, or the narrowed cell still passes somewhere, is it
  narrowed by the field of its pair one field apart (``table.rotary_dim 18``), which names a value
  one walk happened to change rather than what the failing cases are.
* A *full* cell (every case inside fails, at once or once narrowed) loses each alignment relation
  it also fails fully without: a relation that splits nothing is a coincidence of the cases the
  diagnosis tried (a second key head off 16 bytes where the key heads are the trigger), not the
  trigger.
* Then every conjunct left is shown necessary on cases outside it, or dropped, or marked
  unconfirmed (``necessity.py``).
"""

from __future__ import annotations

from typing import Callable

from mla_fuse_conformance.cases import fields as case_fields
from mla_fuse_conformance.cases.address_relations import VECTOR_HALVES
from mla_fuse_conformance.cases.value_relations import without_rotation
from mla_fuse_conformance.commands.conformance_map.diagnosis import (DATA_FIELDS, Diagnosis, _base, measure,
                                                     relations_of)
from mla_fuse_conformance.commands.conformance_map.necessity import check_conjuncts

ADDRESS_RELATIONS = ("-byte aligned", "half >= ")  # diagnosis.alignment_relations: what vector accesses need


def is_address_relation(name: str) -> bool:
    return any(part in name for part in ADDRESS_RELATIONS)


def splitting_relations(failing: list[dict], passing: list[dict]) -> list[tuple[str, object]] | None:
    """``[(relation, value)]`` whose conjunction holds on every ``failing`` case (relations by name)
    and on no ``passing`` one, each excluding a passing case the ones before it kept; None where no
    conjunction of the relations the failing cases share does."""
    shared = {name: value for name, value in failing[0].items()
              if all(name in relations and relations[name] == value for relations in failing[1:])}
    chosen, left = [], list(passing)
    while left:
        def excluded(name: str) -> int:
            return sum(relations.get(name) != shared[name] for relations in left)

        name = max(shared, key=lambda n: (excluded(n), "-byte aligned" in n, is_address_relation(n)), default=None)
        if name is None or not excluded(name):
            return None
        chosen.append((name, shared.pop(name)))
        left = [relations for relations in left if relations.get(name) == chosen[-1][1]]
    return chosen


def measure_and_refine(prop, impl, strategy, run_example: Callable, diagnosis: Diagnosis, failing_case) -> None:
    """Measure the cell's failure rate, narrow a partial cell (by relations, else by its pair's
    field), then prune it where it is full (module docstring)."""
    members: list[tuple[dict | None, bool]] = []
    diagnosis.rate, diagnosis.pair = measure(prop, impl, strategy, run_example, diagnosis.condition, failing_case,
                                             members=members)
    if not diagnosis.rate[1]:
        return
    if diagnosis.rate[0] < diagnosis.rate[1] and not _narrow_by_relations(prop, impl, strategy, run_example,
                                                                         diagnosis, failing_case, members):
        _narrow_by_pair(prop, impl, strategy, run_example, diagnosis, failing_case)
    if diagnosis.rate[0] == diagnosis.rate[1]:
        _drop_relations_that_split_nothing(prop, impl, strategy, run_example, diagnosis, failing_case)
    check_conjuncts(prop, impl, strategy, run_example, diagnosis, failing_case)


def _narrow_by_relations(prop, impl, strategy, run_example, diagnosis: Diagnosis, failing_case, members) -> bool:
    own = without_rotation(relations_of(_base(failing_case)), prop.rotates)
    failing = [own] + [relations for relations, fails in members if fails and relations is not None]
    passing = [relations for relations, fails in members if not fails and relations is not None]
    split = splitting_relations(failing, passing) if own else None
    if not split:
        return False
    narrowed = diagnosis.condition + [["relation", name, case_fields.show(value)] for name, value in split]
    rate, _ = measure(prop, impl, strategy, run_example, narrowed, failing_case)
    if not rate[1] or rate[0] < rate[1]:
        return False
    diagnosis.refined_from, diagnosis.condition, diagnosis.rate = diagnosis.rate, narrowed, rate
    return True


def _narrow_by_pair(prop, impl, strategy, run_example, diagnosis: Diagnosis, failing_case) -> None:
    """A partial cell whose walk found the field that separates a failing from a passing member is
    narrowed by that field's failing value and measured again (the pair is kept: it is why)."""
    if not diagnosis.pair:
        return
    field = diagnosis.pair["field"]
    in_condition = any(kind.startswith("field") and name == field for kind, name, _ in diagnosis.condition)
    if field in DATA_FIELDS or in_condition:
        return
    narrowed = diagnosis.condition + [["field", field, [diagnosis.pair["failing"]]]]
    rate, _ = measure(prop, impl, strategy, run_example, narrowed, failing_case)
    if rate[1]:
        diagnosis.pair["unrefined_rate"] = diagnosis.rate
        diagnosis.condition, diagnosis.rate = narrowed, rate


def _drop_relations_that_split_nothing(prop, impl, strategy, run_example, diagnosis: Diagnosis,
                                       failing_case) -> None:
    literals = [c for c in diagnosis.condition if c[0] == "relation" and is_address_relation(c[1])]
    for literal in sorted(literals, key=lambda c: c[1] == VECTOR_HALVES):  # the one that names the store kept longest
        without = [c for c in diagnosis.condition if c is not literal]
        if not without:
            continue
        rate, _ = measure(prop, impl, strategy, run_example, without, failing_case)
        if not rate[1] or rate[0] < rate[1]:
            continue
        diagnosis.condition, diagnosis.rate = without, rate
        diagnosis.forget_relation(literal[1])
