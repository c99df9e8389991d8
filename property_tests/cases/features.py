"""The feature axes of a case: what kind of input an example is, and how to move it along an axis.

Every case (``cases.py``) has a value on each axis that applies to it: ``dtype: bfloat16``,
``query rank: 3``, ``heads: >1``, ``kv_cache_dtype: fp8_e4m3``, ``cache order: HND``... One table
serves three purposes:

* statistics: each example's features are hypothesis ``event()``s (``--hypothesis-show-statistics``);
* capabilities: an implementation declares the values it supports (``capabilities.py``) and a
  drawn case is moved onto them with ``Axis.set`` (no rejection sampling);
* the conformance map (``mapping.py``): a failing case is moved along one axis at a time to
  find which of its feature values the failure needs.

``Axis.values`` is the contract's domain, simplest first. ``Axis.set(case, value)`` returns a valid
case with that value and everything else kept as far as possible, or None where the value cannot
be reached from this case (then projections reject the example and the map does not vary it).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase, ScaleSpec
from mla_fuse_conformance.declarations.dtypes import (FLOAT_DTYPES, FP8_CACHE_DTYPES, FP8_STORAGES, INDEX_DTYPES,
                                                       KV_CACHE_DTYPES)

replace = dataclasses.replace


@dataclasses.dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[str, ...]
    of: Callable[[object], str | None]  # None: the axis does not apply to this case
    setter: Callable[[object, str], object | None] | None = None
    rope_only: bool = False  # applies only to operations that rotate (not the unfused cache writes)

    def set(self, case, value: str):
        if self.of(case) is None or self.setter is None:
            return None
        if self.of(case) == value:
            return case
        moved = self.setter(case, value)
        return moved if moved is not None and self.of(moved) == value else None


def _is_rope(case) -> bool:
    return isinstance(case, RopeCase)


# ---------------------------------------------------------------- value getters and setters


def _dtype(case):
    return case.dtype


def _set_dtype(case, value):
    named = getattr(case, "kv_cache_dtype", None) in FLOAT_DTYPES
    moved = replace(case, dtype=value)
    return replace(moved, kv_cache_dtype=value) if named else moved


def _table_dtype(case):
    return "input dtype" if case.table.dtype == "input" and case.dtype != "float32" else "float32"


def _set_table_dtype(case, value):
    return replace(case, table=replace(case.table, dtype="input" if value == "input dtype" else "float32"))


def _positions_dtype(case):
    return case.positions.dtype


def _set_positions_dtype(case, value):
    return replace(case, positions=replace(case.positions, dtype=value))


def _positions_layout(case):
    return "strided" if case.positions.stride > 1 else "contiguous"


def _set_positions_layout(case, value):
    return replace(case, positions=replace(case.positions, stride=1 if value == "contiguous" else 2))


def _slots_layout(case):
    return None if _is_rope(case) else "strided" if case.slots.stride > 1 else "contiguous"


def _set_slots_layout(case, value):
    return replace(case, slots=replace(case.slots, stride=1 if value == "contiguous" else 2))


def _style(case):
    return "neox" if case.is_neox else "gptj"


def _set_style(case, value):
    return replace(case, is_neox=value == "neox")


def _tokens(case):
    return "0" if case.tokens == 0 else "1" if case.tokens == 1 else "2-16" if case.tokens <= 16 else ">16"


def _nan(case):
    return "yes" if case.values.nan_count else "no"


def _set_nan(case, value):
    moved = replace(case, values=replace(case.values, nan_count=1 if value == "yes" else 0))
    if hasattr(moved, "value_values") and value == "no":
        moved = replace(moved, value_values=replace(moved.value_values, nan_count=0))
    return moved


def _query_rank(case):
    return str(case.rank) if _is_rope(case) else None


def _rank_placement(place: Placement, rank: int) -> Placement:
    if not place.pad:
        return place
    pad, offset = (place.pad[0], max(place.pad[1:])), (place.offset[0], min(place.offset[-1], max(place.pad[1:])))
    if rank == 3:
        pad, offset = (pad[0], 0, pad[1]), (offset[0], 0, offset[1])
    return replace(place, pad=pad, offset=offset, order=())


def _set_query_rank(case, value):
    rank = int(value)
    packed = case.qkv_packed  # a packed buffer's placement has rank 2 whatever the query's rank
    return replace(case, rank=rank, query_place=case.query_place if packed else _rank_placement(case.query_place, rank),
                   key_place=case.key_place if packed else _rank_placement(case.key_place, rank))


def _heads(case):
    return "1" if case.heads == 1 else ">1"


def _set_heads(case, value):
    if isinstance(case, FlashCase):  # H = Hkv is kept; H > Hkv (GQA) is its own axis
        return replace(case, heads=1, kv_heads=1) if value == "1" else replace(case, heads=2 * case.heads,
                                                                               kv_heads=2 * case.kv_heads)
    return replace(case, heads=1 if value == "1" else 2)


def _key(case):
    return ("present" if case.kv_heads else "none") if _is_rope(case) else None


def _set_key(case, value):
    return replace(case, kv_heads=1 if value == "present" else 0, key_place=Placement())


def _key_heads(case):
    if _is_rope(case):
        return None if not case.kv_heads else "1" if case.kv_heads == 1 else ">1"
    return "1" if isinstance(case, FlashCase) and case.kv_heads == 1 else ">1" if isinstance(case, FlashCase) else None


def _set_key_heads(case, value):
    kv_heads = 1 if value == "1" else 2
    if isinstance(case, FlashCase):
        return replace(case, kv_heads=kv_heads, heads=kv_heads * max(case.heads // case.kv_heads, 1))
    return replace(case, kv_heads=kv_heads)


def _rotary(case):
    if isinstance(case, MlaCase):
        return None  # MLA's q_pe/k_pe are exactly R wide: always full
    return "partial" if case.table.rotary_dim < case.head_size else "full"


def _set_rotary(case, value):
    rotary_dim = case.table.rotary_dim
    return replace(case, head_size=rotary_dim if value == "full" else rotary_dim + 2)


def _gqa(case):
    if not isinstance(case, FlashCase):
        return None
    return "H > Hkv" if case.heads > case.kv_heads else "H = Hkv"


def _set_gqa(case, value):
    return replace(case, heads=case.kv_heads * (2 if value == "H > Hkv" else 1))


def _inputs(case):
    if _is_rope(case):
        plain = not case.qkv_packed and case.query_place.is_plain() and case.key_place.is_plain()
        return "contiguous" if plain else "packed" if case.qkv_packed else "strided"
    if isinstance(case, MlaCase):
        plain = not case.kv_packed and case.kv_place.is_plain() and case.q_place.is_plain()
        return "contiguous" if plain else "packed" if case.kv_packed else "strided"
    plain = not case.qkv_packed and all(p.is_plain() for p in (case.query_place, case.key_place, case.value_place))
    return "contiguous" if plain else "packed" if case.qkv_packed else "strided"


def _set_inputs(case, value):
    if value == "strided":
        return None  # which dims to pad is the strategy's business
    plain = Placement()
    if isinstance(case, MlaCase):
        return replace(case, kv_packed=value == "packed", kv_place=plain, q_place=plain)
    fields = dict(qkv_packed=value == "packed", query_place=plain, key_place=plain)
    if isinstance(case, FlashCase):
        fields["value_place"] = plain
    return replace(case, **fields)


def _kv_cache_dtype(case):
    return None if _is_rope(case) else case.kv_cache_dtype


def _set_kv_cache_dtype(case, value):
    if value in FLOAT_DTYPES and value != case.dtype:
        return None
    storage = case.cache_storage if case.cache_storage != "source" else "uint8"
    return replace(case, kv_cache_dtype=value, cache_storage=storage if value in FP8_CACHE_DTYPES else "source")


def _fp8_storage(case):
    if _is_rope(case) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    return case.cache_storage


def _set_fp8_storage(case, value):
    return replace(case, cache_storage=value)


def _cache_layout(case):
    if _is_rope(case):
        return None
    if getattr(case, "shared_pool", False):
        return "K and V in one pool"
    return "contiguous" if case.cache_place.is_plain() else "view into a pool"


def _set_cache_layout(case, value):
    if value == "view into a pool":
        return None
    if value == "K and V in one pool":
        return replace(case, shared_pool=True, value_head_size=case.head_size) if isinstance(case, FlashCase) else None
    return replace(case, cache_place=Placement(), shared_pool=False) if isinstance(case, FlashCase) else \
        replace(case, cache_place=Placement())


CACHE_ORDERS = {(0, 1, 2): "NHD", (0, 2, 1): "HND"}


def _cache_order(case):
    return CACHE_ORDERS.get(tuple(case.cache_order), "other") if isinstance(case, FlashCase) else None


def _set_cache_order(case, value):
    orders = {name: order for order, name in CACHE_ORDERS.items()}
    return replace(case, cache_order=orders[value]) if value in orders else None


def _value_head_size(case):
    if not isinstance(case, FlashCase):
        return None
    return "Dv = D" if case.value_head_size == case.head_size else "Dv != D"


def _set_value_head_size(case, value):
    if value == "Dv = D":
        return replace(case, value_head_size=case.head_size)
    return replace(case, value_head_size=case.head_size + 1, shared_pool=False)


def _per_head_scales(case):
    if not isinstance(case, FlashCase) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    return "yes" if case.k_scale.per_head or case.v_scale.per_head else "no"


def _set_per_head_scales(case, value):
    if value == "yes":
        return replace(case, k_scale=replace(case.k_scale, per_head=True))
    return replace(case, k_scale=replace(case.k_scale, per_head=False), v_scale=replace(case.v_scale, per_head=False))


def _scale(case):
    if _is_rope(case) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    scales = (case.scale,) if isinstance(case, MlaCase) else (case.k_scale, case.v_scale)
    return "1" if all(s.log2 == 0 and s.mantissa == 1 for s in scales) else "other"


def _set_scale(case, value):
    if value != "1":
        return None
    if isinstance(case, MlaCase):
        return replace(case, scale=ScaleSpec())
    return replace(case, k_scale=ScaleSpec(per_head=case.k_scale.per_head),
                   v_scale=ScaleSpec(per_head=case.v_scale.per_head))


def _kv_scales(case):
    if not isinstance(case, FlashCase) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    return "equal" if case.k_scale == case.v_scale else "differ"


def _set_kv_scales(case, value):
    if value == "equal":
        return replace(case, v_scale=case.k_scale)
    return replace(case, v_scale=replace(case.k_scale, log2=case.k_scale.log2 + 1))


def _padding(case):
    return None if _is_rope(case) else case.slots.padding


def _set_padding(case, value):
    return replace(case, slots=replace(case.slots, padding=value))


def _slot_length(case):
    if _is_rope(case):
        return None
    return "= T" if case.slots.length == case.tokens else "< T"


def _set_slot_length(case, value):
    if value == "< T":
        return replace(case, slots=replace(case.slots, length=case.tokens - 1)) if case.tokens else None
    return replace(case, slots=replace(case.slots, length=case.tokens))


def _slot_dtype(case):
    return None if _is_rope(case) else case.slots.dtype


def _set_slot_dtype(case, value):
    return replace(case, slots=replace(case.slots, dtype=value))


AXES: tuple[Axis, ...] = (
    Axis("dtype", FLOAT_DTYPES, _dtype, _set_dtype),
    Axis("table dtype", ("float32", "input dtype"), _table_dtype, _set_table_dtype, rope_only=True),
    Axis("positions dtype", INDEX_DTYPES, _positions_dtype, _set_positions_dtype, rope_only=True),
    Axis("positions layout", ("contiguous", "strided"), _positions_layout, _set_positions_layout, rope_only=True),
    Axis("slot_mapping dtype", INDEX_DTYPES, _slot_dtype, _set_slot_dtype),
    Axis("slot_mapping layout", ("contiguous", "strided"), _slots_layout, _set_slots_layout),
    Axis("style", ("neox", "gptj"), _style, _set_style, rope_only=True),
    Axis("query rank", ("3", "2"), _query_rank, _set_query_rank, rope_only=True),
    Axis("heads", ("1", ">1"), _heads, _set_heads, rope_only=True),
    Axis("key", ("present", "none"), _key, _set_key, rope_only=True),
    Axis("key heads", ("1", ">1"), _key_heads, _set_key_heads),
    Axis("GQA", ("H = Hkv", "H > Hkv"), _gqa, _set_gqa, rope_only=True),
    Axis("rotary", ("full", "partial"), _rotary, _set_rotary, rope_only=True),
    Axis("inputs", ("contiguous", "packed", "strided"), _inputs, _set_inputs),
    Axis("value head size", ("Dv = D", "Dv != D"), _value_head_size, _set_value_head_size),
    Axis("kv_cache_dtype", KV_CACHE_DTYPES, _kv_cache_dtype, _set_kv_cache_dtype),
    Axis("fp8 storage", FP8_STORAGES, _fp8_storage, _set_fp8_storage),
    Axis("scale", ("1", "other"), _scale, _set_scale),
    Axis("per-head scales", ("no", "yes"), _per_head_scales, _set_per_head_scales),
    Axis("K, V scales", ("equal", "differ"), _kv_scales, _set_kv_scales),
    Axis("cache layout", ("contiguous", "view into a pool", "K and V in one pool"), _cache_layout,
         _set_cache_layout),
    Axis("cache order", ("NHD", "HND", "other"), _cache_order, _set_cache_order),
    Axis("padding", ("none", "some", "all"), _padding, _set_padding),
    Axis("slot_mapping length", ("= T", "< T"), _slot_length, _set_slot_length),
    Axis("tokens", ("2-16", "1", "0", ">16"), _tokens),
    Axis("NaN inputs", ("no", "yes"), _nan, _set_nan),
)
AXIS = {axis.name: axis for axis in AXES}


def axes_for(rotates: bool) -> tuple[Axis, ...]:
    """The axes of an operation's cases (the unfused cache writes do not rotate)."""
    return tuple(axis for axis in AXES if rotates or not axis.rope_only)


def features(case, rotates: bool = True) -> dict[str, str]:
    """``{axis name: value}`` for every axis that applies to ``case`` under an operation that
    rotates (``rotates``) or only writes the cache. A case of another kind (a compile-pass
    ``CompileCase``) is on none of these axes: ``{}``."""
    if not isinstance(case, (RopeCase, MlaCase, FlashCase)):
        return {}
    found = {}
    for axis in axes_for(rotates):
        value = axis.of(case)
        if value is not None:
            found[axis.name] = value
    return found


def describe(cell: dict[str, str]) -> str:
    """``query rank 3, heads >1`` (in the order of ``AXES``)."""
    order = {axis.name: index for index, axis in enumerate(AXES)}
    return ", ".join(f"{name} {cell[name]}" for name in sorted(cell, key=order.__getitem__)) or "(any case)"
