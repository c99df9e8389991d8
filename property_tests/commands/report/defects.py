"""Defects: the failing cells of a report grouped by what they describe (docs/REPORT.md "defects").

One defect fails several properties, and a map can describe it once broadly and once more narrowly;
report.json's ``cells`` keeps one entry per property and condition (the ids ``--baseline`` matches).
A defect is a group of cells of one failure kind (``identity.kind_family``: a wrong result and a
crash are one) whose conditions are the same or where one implies the other, across properties and
operations. Implication is read off the conditions as data (``condition.data``, the map's
conjuncts), never guessed from the text:

* a conjunct ``["relation", NAME, VALUE]`` implies the same relation with the same value;
* ``["field", PATH, VALUES]`` implies ``["field", PATH, MORE]`` where VALUES are among MORE, and
  ``["field-not", PATH, EXCLUDED]`` where none of VALUES is excluded;
* ``["field-not", PATH, EXCLUDED]`` implies ``["field-not", PATH, FEWER]`` where FEWER are among EXCLUDED;
* a feature axis' ``["axis", AXIS, VALUES]`` and ``["axis-not", AXIS, EXCLUDED]`` (``conformance_map/holds.py``)
  likewise.

Cell A implies cell B where each conjunct of B is implied by a conjunct of A (A's cases are B's
cases). A cell of feature values only implies another where its values include the other's. The
groups are the connected parts of that relation; each is shown by its widest condition (one every
other member implies, else the first found). A cell whose diagnosis the map's time budget cut short
(``cut_short``: its condition not all shown) is a defect of its own, joined to none.
"""

from __future__ import annotations

from mla_fuse_conformance.commands.conformance_map.identity import cut_short_note, kind_family


def _conjunct_implies(mine: list, theirs: list) -> bool:
    kind, name, value = mine
    other_kind, other_name, other_value = theirs
    if name != other_name:
        return False
    if kind == "relation" or other_kind == "relation":
        return kind == other_kind and value == other_value
    base, other_base = kind.removesuffix("-not"), other_kind.removesuffix("-not")
    if base != other_base:  # a field and a feature axis of the same name are different things
        return False
    if kind == base and other_kind == base:
        return set(value) <= set(other_value)
    if kind == base:
        return not set(value) & set(other_value)
    if other_kind != other_base:
        return set(other_value) <= set(value)
    return False


def implies(cell: dict, other: dict) -> bool:
    """Whether every case inside ``cell``'s condition is inside ``other``'s (by their conjuncts)."""
    mine, theirs = cell["condition"].get("data"), other["condition"].get("data")
    if mine is not None and theirs is not None:
        return all(any(_conjunct_implies(a, b) for a in mine) for b in theirs)
    if mine is None and theirs is None:
        values, needed = cell["condition"].get("features") or {}, other["condition"].get("features") or {}
        return all(values.get(axis) == value for axis, value in needed.items())
    return cell["condition"].get("text") == other["condition"].get("text")


def defects(cells: list[dict]) -> list[dict]:
    """``cells`` (report.json entries) grouped into defects, in the order their first cell comes:
    ``{"condition", "kind", "cells": [ids], "properties": [...], "operations": [...]}``."""
    groups: list[list[dict]] = []
    for cell in cells:
        joined = [group for group in groups if kind_family(group[0]["kind"]) == kind_family(cell["kind"])
                  and not cell.get("cut_short") and not group[0].get("cut_short")
                  and any(implies(cell, member) or implies(member, cell) for member in group)]
        merged = [member for group in joined for member in group] + [cell]
        groups = [group for group in groups if not any(group is other for other in joined)]
        groups.append(merged)
    groups.sort(key=lambda group: min(cells.index(member) for member in group))
    out = []
    for group in groups:
        widest = next((member for member in group if all(implies(other, member) for other in group)), group[0])
        out.append({"condition": widest["condition"]["text"], "kind": widest["kind"], "cut_short": widest.get("cut_short"),
                    "cells": [member["id"] for member in group],
                    "properties": list(dict.fromkeys(member["property"] for member in group)),
                    "operations": list(dict.fromkeys(op for member in group for op in member.get("operations") or ()))})
    return out


def count_line(found: list[dict], cells: list[dict]) -> str:
    """``2 defects (5 failing cells)``: what a report's first line counts."""
    return (f"{len(found)} defect{'s' if len(found) != 1 else ''} ({len(cells)} failing "
            f"cell{'s' if len(cells) != 1 else ''})")


def console_lines(report: dict) -> list[str]:
    """``verify``'s account of the defects, before its verdict line (none where nothing was mapped)."""
    found, cells = report.get("defects") or [], report.get("cells") or []
    if not found:
        return []
    out = [f"defects: {count_line(found, cells)}"]
    for number, entry in enumerate(found, 1):
        properties = entry.get("properties") or []
        out.append(f"  {number}. {entry['condition']}{cut_short_note(entry.get('cut_short'))} ({entry['kind']}): "
                   f"{len(entry['cells'])} cell(s) in "
                   f"{len(properties)} propert{'y' if len(properties) == 1 else 'ies'}: {', '.join(properties)}")
    return out
