"""What a failing case's failure needs, in the case's own fields (the conformance map's step 2).

Given hypothesis' shrunk failing case:

1. Vary one generated field at a time over its alternatives (``cases.fields``: every size, the
   block size, each buffer's memory order, padding, offset and storage offset, index dtypes and
   layouts, value ranges), everything else and the seed kept. A value *fails* when the example
   fails; it *passes* when the example passes with ``SEEDS`` (3) different seeds (a NaN that happens
   to hide the one wrong element must not make "no NaN" part of the trigger). A field whose every
   tried value fails carries no information and is dropped; the others are the trigger's fields,
   reported as ``block_size: 3, 5 fail; 1, 2, 4 pass``.
2. Compute derived relations (``fields.relations``: strides against sizes, powers of two, lengths;
   ``cases/address_relations.py``: which rotated halves start 16-byte aligned) on every tried case. A
   relation that takes one value on every failing case tried and another
   on every passing one *separates* them. Each trigger field is explained by the relation that
   separates its own values, is true of most failing cases tried (a relation the failure needs holds
   on each) and explains most fields (greedy); a relation that separates every
   case tried is named as the trigger itself (``kv_cache block stride == block_size x entry
   stride: no fails, yes passes``).
3. The cell is the conjunction of those relations (and, for a field no relation explains, its
   failing values). Its failure rate is measured on random cases inside it (drawn by hypothesis
   from the property's strategy, the others rejected); where only some fail, a passing member is
   walked towards the failing case one field at a time: the step where it starts to fail gives a
   failing and a passing example that differ in one field, reported with the rate ("partial").
   A drawn case outside a cell with field values is first moved onto them (``fields.vary``), so
   that a narrow cell (``latent 37``) is measured too. ``commands/conformance_map/refinement.py`` then narrows a
   partial cell by the relations that split its failing from its passing cases (else by its pair's
   field), and drops from a full one an alignment relation that splits nothing.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption

from mla_fuse_conformance.cases import fields as case_fields
from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.cases.address_relations import alignment_relations
from mla_fuse_conformance.cases.features import AXIS
from mla_fuse_conformance.cases.types import BadInputCase
from mla_fuse_conformance.cases.value_relations import without_rotation
from mla_fuse_conformance.running.executor import ChildNotProvided, Crashed, RaisedInChild
from mla_fuse_conformance.settings import profiles

FAILURES = (AssertionError, RaisedInChild, Crashed)
# relations a failure of a write needs trivially (nothing written, nothing wrong): listed last, and
# the fields they explain summarized in one line
PRECONDITIONS = ("some slot written (slot >= 0)", "tokens > 0")
# a conjunct's necessity verdict where the map's time budget ran out before it was checked (``cut_short.py``)
NOT_CHECKED = "not checked"
SEEDS = 3  # a value passes when the example passes with this many seeds (a NaN can hide a wrong element)
RATE_EXAMPLES = 12  # random cases inside a cell to measure its failure rate
CARRIED_RATE_EXAMPLES = 6  # ... inside a cell another property's map derived, confirmed here (one defect, one map)
PAIR_WALKS = 3  # passing members walked towards the failing case, until one gives a pair
# fields that only pick data (not varied by ``diagnose``): the walk to a pair tries them last
DATA_FIELDS = ("values.log2_spread", "value_values.log2_spread", "slots.pad_fraction", "seed")


def _base(case):
    return case.base if isinstance(case, BadInputCase) else case


def outcome(run_example: Callable, case) -> bool | None:
    """True: fails; False: passes; None: does not apply (rejected, not provided)."""
    try:
        run_example(case)
    except FAILURES:
        return True
    except (UnsatisfiedAssumption, ChildNotProvided):
        return None
    return False


def relations_of(case) -> dict[str, bool] | None:
    """The derived relations of ``case`` (built on the CPU), or None where it cannot be built; a kind of
    case with fields of its own (``fields.OTHER_KINDS``: a compile case) has none (``{}``)."""
    if type(_base(case)) in case_fields.OTHER_KINDS:
        return {}
    try:
        built = tensors.build(_base(case), "cpu")
        return {**case_fields.relations(built), **alignment_relations(built)}
    except Exception:  # noqa: BLE001 - a varied case the builders refuse is not tried
        return None


@dataclasses.dataclass
class FieldFinding:
    field: str
    failing: list[str]  # the shrunk case's own value first
    passing: list[str]
    explained_by: str | None = None  # a relation that separates this field's failing and passing values

    def line(self) -> str:
        why = f"  [{self.explained_by}]" if self.explained_by else ""
        return (f"{self.field}: {', '.join(self.failing)} fail{'s' if len(self.failing) == 1 else ''}; "
                f"{', '.join(self.passing)} pass{'es' if len(self.passing) == 1 else ''}{why}")


@dataclasses.dataclass
class Diagnosis:
    """The trigger of one failing case, in its fields and their relations (module docstring)."""

    fields: list[FieldFinding]  # the fields with a passing value
    relations: dict[str, str]  # relations separating every case tried: name -> the failing value ("yes"/"no")
    # the cell: [["relation", name, "yes"|"no"] | ["field" | "field-not", path, [shown values]]
    # | ["axis" | "axis-not", feature axis, [values]]] (an axis' values excluded: holds.py)
    condition: list[list]
    tried: int = 0  # examples run to find the above
    dropped: int = 0  # fields varied whose every value failed
    rate: list[int] | None = None  # [failing, tried] among random cases inside the cell
    pair: dict | None = None  # a partial cell: {"field", "failing", "passing"}: one field apart
    refined_from: list[int] | None = None  # the rate before relations splitting its cases narrowed the cell
    necessity: list[dict] | None = None  # per conjunct checked: {conjunct, inside, outside, verdict} (necessity.py)
    admits: dict[str, list[str]] | None = None  # per feature axis the values the condition admits (admits.py)
    cut_short: str | None = None  # the step the map's time budget ran out in (cut_short.py), else None

    @classmethod
    def from_dict(cls, data: dict) -> "Diagnosis":
        """Inverse of ``dataclasses.asdict`` (a ``Cell`` keeps its diagnosis as a dict, for report.json)."""
        return cls(**dict(data, fields=[f if isinstance(f, FieldFinding) else FieldFinding(**f)
                                        for f in data["fields"]]))

    def describe(self) -> str:
        parts = []
        unshown = [entry["conjunct"] for entry in self.necessity or ()
                   if entry["verdict"] in ("unconfirmed", NOT_CHECKED)]
        for conjunct in sorted(self.condition, key=lambda c: c[1] in PRECONDITIONS and c[2] == "yes"):
            kind, name, value = conjunct
            if kind == "relation":
                parts.append(f"{name}: {value}")
            elif kind.endswith("-not"):
                parts.append(f"{name} not {' or '.join(value)}")
            else:
                parts.append(f"{name} {' or '.join(value)}")
            if conjunct in unshown:
                parts[-1] += " (not shown needed)"
        return "; ".join(parts) or ("no condition established" if self.cut_short else "(any case)")

    def forget_relation(self, name: str) -> None:
        """``name`` no longer a relation of the cell: out of ``relations``, and no field explained by it."""
        self.relations.pop(name, None)
        for finding in self.fields:
            if (finding.explained_by or "").startswith(f"{name}: "):
                finding.explained_by = None

    def rate_text(self) -> str:
        if not self.rate or not self.rate[1]:
            why = ("the map's time budget ran out first" if self.cut_short and not self.rate
                   else "no random case inside the cell was drawn")
            return f"failure rate not measured ({why})"
        failing, tried = self.rate
        text = f"fails {failing}/{tried} random cases inside it"
        if self.refined_from:
            text += (f" (refined: without the relations that split its failing from its passing cases "
                     f"the cell failed {self.refined_from[0]}/{self.refined_from[1]})")
        if self.pair and "unrefined_rate" in self.pair:
            before = self.pair["unrefined_rate"]
            text += (f" (refined: without {self.pair['field']} {self.pair['failing']} the cell failed "
                     f"{before[0]}/{before[1]}; {self.pair['field']} {self.pair['passing']} passes, the rest of "
                     "a case the same)")
        if failing < tried:
            text += f" (partial: {self.pair_text()})"
        return text

    def pair_text(self) -> str:
        """The failing and the passing example one field apart of a partial cell."""
        if not self.pair:
            return ("no passing example one field apart from a failing one was found (the passing cases "
                    "could not be reached one allowed field at a time)")
        seeds = "" if self.pair.get("every_seed", True) else " (passes with this seed, not every seed)"
        return (f"{self.pair['field']} {self.pair['failing']} fails, {self.pair['passing']} passes, the rest of the "
                f"case the same{seeds}")

    def lines(self, indent: str = "          ") -> list[str]:
        out = [f"{indent}trigger relation {name}: {value} fails, {'yes' if value == 'no' else 'no'} passes"
               for name, value in self.relations.items()]
        trivial = [f for f in self.fields if f.explained_by in [f"{p}: yes fails" for p in PRECONDITIONS]]
        out += [f"{indent}{finding.line()}" for finding in self.fields if finding not in trivial]
        if trivial:
            names = ", ".join(finding.field for finding in trivial)
            passing = "; ".join(f"{finding.field} {','.join(finding.passing)}" for finding in trivial)
            out.append(f"{indent}{names}: pass only with values that leave nothing to do (no token, or no slot "
                       f"written) ({passing})")
        if self.dropped:
            out.append(f"{indent}({self.dropped} other field(s) varied: every value fails, so they are any value)")
        return out


def _separates(observations: list[tuple[dict, bool]], name: str) -> str | None:
    """The failing value ("yes"/"no") of relation ``name`` when it separates ``observations``; a
    relation some of them lack (an fp8 band of a case whose cache is not fp8) separates nothing."""
    failing = {rel.get(name) for rel, fails in observations if fails}
    passing = {rel.get(name) for rel, fails in observations if not fails}
    if len(failing) == 1 and passing and None not in failing | passing and not failing & passing:
        return case_fields.show(next(iter(failing)))
    return None


def diagnose(prop, impl, run_example: Callable, case) -> Diagnosis:
    """Steps 1 and 2 of the module docstring for ``case`` (a failing case of ``prop``)."""
    base = _base(case)
    own = without_rotation(relations_of(base), prop.rotates) or {}
    per_field: dict[str, list[tuple[dict, bool]]] = {}
    findings: dict[str, FieldFinding] = {}
    tried = dropped = 0
    failing_seen = [own]  # every failing case tried, of every field varied (those whose every value fails too)
    for path, value in case_fields.leaves(base, prop.rotates).items():
        observations = [(own, True)]
        failing, passing = [case_fields.show(value)], []
        for other in case_fields.alternatives(base, path):
            moved = case_fields.vary(base, path, other)
            if moved is None or not prop.allows(impl, moved):
                continue
            rel = relations_of(moved)
            if rel is None:
                continue
            fails, decided = None, moved
            for offset in range(SEEDS):
                decided = dataclasses.replace(moved, seed=(moved.seed + offset) % 2 ** 32)
                tried += 1
                fails = outcome(run_example, decided)
                if fails is not False:
                    break
            # the relations of the seed that failed (the data is the seed's: a value relation differs by seed)
            rel = relations_of(decided) if fails and decided is not moved else rel
            if fails is None or rel is None:
                continue
            (failing if fails else passing).append(case_fields.show(other))
            observations.append((rel, fails))
            if fails:
                failing_seen.append(rel)
        if len(observations) > 1 and not passing:
            dropped += 1
        if passing:
            per_field[path] = observations
            findings[path] = FieldFinding(path, failing, passing)
    every = [(own, True)] + [obs for observations in per_field.values() for obs in observations[1:]]
    names = list(own)
    separating = {name: value for name in names if (value := _separates(every, name))}
    # each field's explanation: among the relations separating its own values, the one explaining most fields
    explains = {name: {path for path, obs in per_field.items() if _separates(obs, name)} for name in names}
    unexplained = set(per_field)
    condition: list[list] = [["relation", name, value] for name, value in separating.items()]
    for name in separating:
        for path in explains[name]:
            findings[path].explained_by = f"{name}: {separating[name]} fails"
        unexplained -= explains[name]
    # a condition is true of every case with the trigger, and a relation the failure needs holds on each
    # failing case tried (but for a case failing by another defect): of the relations explaining a field
    # left, first those true of more failing cases, then those explaining most fields, then the first listed
    # (``value_relations`` lists the narrower value bands first)
    holds_on = {name: sum(case_fields.show(rel.get(name)) == case_fields.show(own[name]) for rel in failing_seen)
                for name in names}
    while unexplained and names:  # (a kind of case without relations, a compile case: its fields alone)
        name = max(names, key=lambda n: (bool(explains[n] & unexplained), holds_on[n], len(explains[n] & unexplained),
                                         -names.index(n)))
        covered = explains[name] & unexplained
        if not covered:
            break
        value = case_fields.show(own[name])
        condition.append(["relation", name, value])
        for path in covered:
            findings[path].explained_by = f"{name}: {value} fails"
        unexplained -= covered
    for path in per_field:
        if path in unexplained:
            finding = findings[path]
            condition.append(["field-not", path, finding.passing] if len(finding.passing) < len(finding.failing)
                             else ["field", path, finding.failing])
    ordered = sorted(findings.values(), key=lambda f: (f.explained_by is None, f.explained_by or "", f.field))
    return Diagnosis(ordered, separating, condition, tried, dropped)


def inside(condition: list[list], case, relations: dict | None = None) -> bool:
    """Whether ``case`` lies in the cell ``condition`` (a ``Diagnosis.condition``)."""
    base = _base(case)
    if not condition:
        return True
    values = None
    for kind, name, value in condition:
        if kind in ("field", "field-not"):
            values = values or case_fields.leaves(base)
            if (case_fields.show(values.get(name)) in value) != (kind == "field"):
                return False
        elif kind in ("axis", "axis-not") and (AXIS[name].of(base) in value) != (kind == "axis"):
            return False
    if any(kind == "relation" for kind, _, _ in condition):
        relations = relations if relations is not None else relations_of(base)
        if relations is None:
            return False
        for kind, name, value in condition:
            if kind == "relation" and case_fields.show(relations.get(name)) != value:
                return False
    return True


def measure(prop, impl, strategy, run_example: Callable, condition: list[list], failing_case,
            examples: int = RATE_EXAMPLES, members: list | None = None, member_cases: list | None = None
            ) -> tuple[list[int], dict | None]:
    """Step 3: ``([failing, tried], pair)`` among random cases inside the cell; ``members`` gets
    ``(relations, fails)`` of each (``commands/conformance_map/refinement.py`` narrows the cell with them),
    ``member_cases`` each case (the same order)."""
    counts = collections.Counter()
    passing_members: list = []
    own = case_fields.leaves(_base(failing_case))

    @settings(profiles.ci_settings(max_examples=examples, phases=[Phase.explicit, Phase.generate],
                                   verbosity=Verbosity.quiet, database=None,
                                   suppress_health_check=list(HealthCheck)))
    @given(case=strategy)
    def sample(case):
        if not inside(condition, case):  # a drawn case moved onto the cell's field values, where it can be
            for kind, path, value in condition:
                if case is None or isinstance(case, BadInputCase):
                    break
                if kind == "field":
                    case = case_fields.vary(case, path, own[path])
                elif kind == "axis":
                    case = AXIS[path].set(case, value[0])
            if case is None or not prop.allows(impl, case) or not inside(condition, case):
                reject()
        fails = outcome(run_example, case)
        if fails is None:
            reject()
        counts[fails] += 1
        if members is not None:
            members.append((relations_of(case), fails))
        if member_cases is not None:
            member_cases.append(_base(case))
        if not fails:
            passing_members.append(_base(case))

    try:
        sample()
    except Unsatisfiable:
        pass
    rate = [counts[True], counts[True] + counts[False]]
    walks = (walk(prop, impl, run_example, _base(failing_case), member) for member in passing_members[:PAIR_WALKS])
    return rate, next((pair for pair in walks if pair is not None), None)


def data_fields(case) -> dict[str, object]:
    """The fields of ``case`` that only pick data (``DATA_FIELDS`` it has), by path."""
    out = {}
    for path in DATA_FIELDS:
        head, _, rest = path.partition(".")
        inner = getattr(case, head, None)
        value = getattr(inner, rest, None) if rest else inner
        if value is not None:
            out[path] = value
    return out


def walk(prop, impl, run_example: Callable, failing, passing) -> dict | None:
    """Move ``failing`` towards ``passing`` one field at a time, the generated fields first, then
    those that only pick data and the seed; at the first step that passes, the two cases differ in
    that one field: ``{"field", "failing", "passing", "case", "passing_case"}`` (the cases as JSON).
    A step that passes with every seed is preferred; else the first that passes with its own seed
    (``"every_seed": False``, except for a step of the seed itself, whose pair names the seed)."""
    if type(failing) is not type(passing):
        return None
    targets = {**case_fields.leaves(passing), **data_fields(passing)}
    current, fallback = failing, None
    for path, value in targets.items():
        own = {**case_fields.leaves(current), **data_fields(current)}.get(path)
        if own == value:
            continue
        moved = case_fields.vary(current, path, value)
        if moved is None or not prop.allows(impl, moved):
            continue
        fails = outcome(run_example, moved)
        if fails:
            current = moved
            continue
        if fails is None:
            continue
        pair = {"field": path, "failing": case_fields.show(own), "passing": case_fields.show(value),
                "case": case_types.to_jsonable(current), "passing_case": case_types.to_jsonable(moved)}
        if path != "seed" and all(outcome(run_example, dataclasses.replace(moved, seed=moved.seed + k)) is False
                                  for k in range(1, SEEDS)):
            return pair
        fallback = fallback or dict(pair, every_seed=path == "seed")
    return fallback
