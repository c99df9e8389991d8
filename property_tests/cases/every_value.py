"""Explicit examples that put every value of every feature axis into every profile.

Random drawing reaches a rare value (a NaN input, a short ``slot_mapping``, an fp8 cache under a
given storage) in some runs and not in others; a property's explicit examples run in every
profile, first, every time. ``every_value(cases, rotates)`` gives the examples to add to
``cases`` so that each value of each ``features.AXES`` axis that ``Axis.set`` can reach from
them is in at least one: each missing value is set on the example made last when the values
already set there stay, else on the one of ``cases`` with the most tokens that reaches it (so a
few examples carry all of them; a value that leaves rows unwritten gets an example of its own),
and two fully written fp8 examples, one that saturates its codes, one with a NaN input
(``saturating``). Deterministic: the same examples every run, derived from the axes' table, so a
value added to an axis is covered without editing a list.
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


def written(case):
    """``case`` with every row written (no padding, a full ``slot_mapping``), on fp32 inputs and a
    unit scale, as far as the axes allow."""
    for axis, value in (("padding", "none"), ("slot_mapping length", "= T"), ("scale", "1"), ("dtype", "float32")):
        case = AXIS[axis].set(case, value) or case
    return case


def saturating(cases) -> list:
    """Two fp8 (E4M3) examples with every row written, unless none of ``cases`` writes an E4M3
    cache: one whose values saturate the codes (scaled to ``2^SATURATING_LOG2``: the fp8-saturation
    event), one with a NaN input (NaN's code, not the maximum's or zero's); both made from the E4M3
    example with the most tokens (``written``)."""
    e4m3 = [case for case in cases if getattr(case, "kv_cache_dtype", "") in ("fp8", "fp8_e4m3") and case.tokens]
    if not e4m3:
        return []
    case = written(max(e4m3, key=lambda case: case.tokens))
    saturated = dataclasses.replace(case, values=dataclasses.replace(
        case.values, log2_magnitude=SATURATING_LOG2, nan_count=0))
    if hasattr(case, "value_values"):
        saturated = dataclasses.replace(saturated, value_values=dataclasses.replace(
            case.value_values, log2_magnitude=SATURATING_LOG2, nan_count=0))
    return [made for made in (saturated, AXIS["NaN inputs"].set(case, "yes") or case) if made not in cases]


# values that leave rows unwritten: set on an example of their own, nothing else set on it, so that
# the values set together elsewhere reach the cache
UNWRITTEN = {("padding", "some"), ("padding", "all"), ("slot_mapping length", "< T"), ("tokens", "0")}


def _missing_values(cases, rotates: bool) -> list:
    present = {(axis, value) for case in cases for axis, value in features(case, rotates).items()}
    by_tokens = sorted(cases, key=lambda case: -case.tokens)  # an example that writes something, first
    added: list = []
    pinned: dict[str, str] | None = None  # the values set on the last added example; None: set nothing more on it
    for axis in axes_for(rotates):
        for value in axis.values:
            if (axis.name, value) in present:
                continue
            alone = (axis.name, value) in UNWRITTEN
            stacked = axis.set(added[-1], value) if added and pinned is not None and not alone else None
            if stacked is not None and all(features(stacked, rotates).get(a) == v for a, v in pinned.items()):
                added[-1] = stacked
                pinned[axis.name] = value
            else:
                base = next((moved for case in by_tokens if (moved := axis.set(case, value)) is not None), None)
                if base is None:
                    continue
                added.append(base)
                pinned = None if alone else {axis.name: value}
            present.update((a, v) for a, v in features(added[-1], rotates).items())
    return added
