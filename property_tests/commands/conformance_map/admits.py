"""Which feature values a cell's condition admits (the heat map's colours: docs/REPORT.md "views").

A cell's ``features`` are the feature values its shrunk case had that the failure needed when moved
one at a time: ``kv_cache_dtype fp8`` because moving to ``auto`` passed, although ``fp8_e4m3``
fails as well. Coloured by those alone, a value that fails (``fp8_e4m3``, ``padding some``) showed
green beside a table that says it fails. The condition is what the cell claims: a value is admitted
where the failing case moved to it (``Axis.set``, the rest of the case the same) still lies inside
the condition (``diagnosis.inside``, relations computed on the moved case). No kernel runs: this
reads the condition, it measures nothing.
"""

from __future__ import annotations

from mla_fuse_conformance.cases.features import axes_of, features
from mla_fuse_conformance.commands.conformance_map.diagnosis import _base, inside, relations_of


def admitted(prop, impl, case, condition: list[list] | None, needed: dict[str, str]) -> dict[str, list[str]]:
    """``{axis: [values]}``: per feature axis of ``prop``'s cases, the values whose case (``case``
    moved to the value) the cell holds: inside ``condition`` where the cell has one, else with the
    feature values ``needed``."""
    base = _base(case)
    own = features(base, prop.rotates)
    found: dict[str, list[str]] = {}
    for axis in axes_of(base, prop.rotates):
        if axis.name not in own:
            continue
        values = []
        for value in axis.values:
            moved = base if value == own[axis.name] else axis.set(base, value)
            if moved is None or not prop.allows(impl, moved):
                continue
            if condition is None:
                holds = needed.get(axis.name, value) == value
            else:
                relations = relations_of(moved) if any(kind == "relation" for kind, _, _ in condition) else {}
                holds = relations is not None and inside(condition, moved, relations)
            if holds:
                values.append(value)
        found[axis.name] = values
    return found
