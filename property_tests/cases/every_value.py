"""Explicit examples that put every value of every feature axis into every profile.

Random drawing reaches a rare value (a NaN input, a short ``slot_mapping``, an fp8 cache under a
given storage) in some runs and not in others; a property's explicit examples run in every
profile, first, every time. ``every_value(cases, rotates)`` gives the examples to add to
``cases`` so that each value of each ``features.AXES`` axis that ``Axis.set`` can reach from
them is in at least one: each missing value is set on the example made last when the values
already set there stay, else on the first of ``cases`` with the most tokens that reaches it (so a few examples carry
all of them), and an example that saturates fp8 codes (``saturating``). Deterministic: the same examples every run, derived from the axes' table, so a value
added to an axis is covered without editing a list.
"""

from __future__ import annotations

import dataclasses

from mla_fuse_conformance.cases.features import AXIS, axes_for, features


def every_value(cases, rotates: bool) -> list:
    """The examples to add to ``cases`` (module docstring): passes of ``_missing_values`` until
    none adds one (setting a value on an example can move that example's other values away)."""
    added: list = []
    for _ in range(sum(len(axis.values) for axis in axes_for(rotates))):
        more = _missing_values([*cases, *added], rotates)
        if not more:
            break
        added += more
    return added + saturating([*cases, *added])


SATURATING_LOG2 = 12.0  # |x| ~ 2^12 with a unit scale: far past E4M3's 448, in range of fp32 and bf16


def saturating(cases) -> list:
    """An fp8 (E4M3) example whose values saturate the cache's codes, unless one of ``cases`` has
    such values already or none writes an E4M3 cache: the one with the most tokens, moved to fp32
    inputs and a unit scale, its values scaled to ``2^SATURATING_LOG2``."""
    e4m3 = [case for case in cases if getattr(case, "kv_cache_dtype", "") in ("fp8", "fp8_e4m3") and case.tokens]
    if not e4m3 or any(case.values.log2_magnitude >= 8.8 for case in e4m3):
        return []
    case = max(e4m3, key=lambda case: case.tokens)
    case = AXIS["scale"].set(case, "1") or case
    case = AXIS["dtype"].set(case, "float32") or case
    loud = dataclasses.replace(case.values, log2_magnitude=SATURATING_LOG2, nan_count=0)
    if hasattr(case, "value_values"):
        case = dataclasses.replace(case, value_values=dataclasses.replace(case.value_values, log2_magnitude=SATURATING_LOG2))
    return [dataclasses.replace(case, values=loud)]


def _missing_values(cases, rotates: bool) -> list:
    present = {(axis, value) for case in cases for axis, value in features(case, rotates).items()}
    by_tokens = sorted(cases, key=lambda case: -case.tokens)  # an example that writes something, first
    added: list = []
    pinned: dict[str, str] = {}  # the values set on the last added example
    for axis in axes_for(rotates):
        for value in axis.values:
            if (axis.name, value) in present:
                continue
            stacked = axis.set(added[-1], value) if added else None
            if stacked is not None and all(features(stacked, rotates).get(a) == v for a, v in pinned.items()):
                added[-1] = stacked
                pinned[axis.name] = value
            else:
                base = next((moved for case in by_tokens if (moved := axis.set(case, value)) is not None), None)
                if base is None:
                    continue
                added.append(base)
                pinned = {axis.name: value}
            present.update((a, v) for a, v in features(added[-1], rotates).items())
    return added
