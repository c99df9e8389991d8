"""The feature axes of a case: what kind of input an example is, and how to move it along an axis.

Every case (``types.py``) has a value on each axis that applies to it: ``dtype: bfloat16``,
``query rank: 3``, ``heads: >1``, ``kv_cache_dtype: fp8_e4m3``, ``cache order: HND``... One table
serves three purposes:

* statistics: each example's features are hypothesis ``event()``s (``--hypothesis-show-statistics``);
* capabilities: an implementation declares the values it supports (``contract/capabilities.py``) and a
  drawn case is moved onto them with ``Axis.set`` (no rejection sampling);
* the conformance map (``commands/conformance_map/property_map.py``): a failing case is moved along one axis at a time to
  find which of its feature values the failure needs.

``Axis.values`` is the contract's domain, simplest first. ``Axis.set(case, value)`` returns a valid
case with that value and everything else kept as far as possible, or None where the value cannot
be reached from this case (then projections reject the example and the map does not vary it).
This module declares the axes and computes a case's features; each axis' getter and setter live in
``input_axes.py`` (the inputs), ``cache_axes.py`` (the cache, its scales and the slot mapping) and
``alignment_axes.py`` (the byte alignment of each input's rows, heads and rotated halves, and of the
cache's entries).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from mla_fuse_conformance.cases import alignment_axes, cache_axes, input_axes
from mla_fuse_conformance.cases.alignment_axes import ALIGNMENTS
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES, FP8_STORAGES, INDEX_DTYPES, KV_CACHE_DTYPES


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


AXES: tuple[Axis, ...] = (
    Axis("dtype", FLOAT_DTYPES, input_axes.dtype_of, input_axes.set_dtype),
    Axis("table dtype", ("float32", "input dtype"),
         input_axes.table_dtype_of, input_axes.set_table_dtype, rope_only=True),
    Axis("positions dtype", INDEX_DTYPES,
         input_axes.positions_dtype_of, input_axes.set_positions_dtype, rope_only=True),
    Axis("positions layout", ("contiguous", "strided"),
         input_axes.positions_layout_of, input_axes.set_positions_layout, rope_only=True),
    Axis("slot_mapping dtype", INDEX_DTYPES, cache_axes.slot_dtype_of, cache_axes.set_slot_dtype),
    Axis("slot_mapping layout", ("contiguous", "strided"), cache_axes.slots_layout_of, cache_axes.set_slots_layout),
    Axis("style", ("neox", "gptj"), input_axes.style_of, input_axes.set_style, rope_only=True),
    Axis("query rank", ("3", "2"), input_axes.query_rank_of, input_axes.set_query_rank, rope_only=True),
    Axis("heads", ("1", ">1"), input_axes.heads_of, input_axes.set_heads, rope_only=True),
    Axis("key", ("present", "none"), input_axes.key_of, input_axes.set_key, rope_only=True),
    Axis("key heads", ("1", ">1"), input_axes.key_heads_of, input_axes.set_key_heads),
    Axis("GQA", ("H = Hkv", "H > Hkv"), input_axes.gqa_of, input_axes.set_gqa, rope_only=True),
    Axis("rotary", ("full", "partial"), input_axes.rotary_of, input_axes.set_rotary, rope_only=True),
    Axis("inputs", ("contiguous", "packed", "strided"), input_axes.inputs_of, input_axes.set_inputs),
    Axis("head stride", ("D", "other"), input_axes.head_stride_of, input_axes.set_head_stride),
    Axis("value head size", ("Dv = D", "Dv != D"), cache_axes.value_head_size_of, cache_axes.set_value_head_size),
    Axis("kv_cache_dtype", KV_CACHE_DTYPES, cache_axes.kv_cache_dtype_of, cache_axes.set_kv_cache_dtype),
    Axis("fp8 storage", FP8_STORAGES, cache_axes.fp8_storage_of, cache_axes.set_fp8_storage),
    Axis("scale", ("1", "other"), cache_axes.scale_of, cache_axes.set_scale),
    Axis("per-head scales", ("no", "yes"), cache_axes.per_head_scales_of, cache_axes.set_per_head_scales),
    Axis("K, V scales", ("equal", "differ"), cache_axes.kv_scales_of, cache_axes.set_kv_scales),
    Axis("cache layout", ("contiguous", "view into a pool", "K and V in one pool"), cache_axes.cache_layout_of,
         cache_axes.set_cache_layout),
    Axis("cache order", ("NHD", "HND", "other"), cache_axes.cache_order_of, cache_axes.set_cache_order),
    Axis("padding", ("none", "some", "all"), cache_axes.padding_of, cache_axes.set_padding),
    Axis("slot_mapping length", ("= T", "< T"), cache_axes.slot_length_of, cache_axes.set_slot_length),
    Axis("tokens", ("2-16", "1", "0", ">16"), input_axes.tokens_of),
    Axis("NaN inputs", ("no", "yes"), input_axes.nan_of, input_axes.set_nan),
    # bytes dividing every row, head and rotated half start (alignment_axes.py)
    Axis("q alignment", ALIGNMENTS, alignment_axes.q_alignment_of, alignment_axes.set_q_alignment, rope_only=True),
    Axis("k alignment", ALIGNMENTS, alignment_axes.k_alignment_of, alignment_axes.set_k_alignment),
    Axis("kv_c alignment", ALIGNMENTS, alignment_axes.kv_c_alignment_of, alignment_axes.set_kv_c_alignment),
    Axis("cache alignment", ALIGNMENTS, alignment_axes.cache_alignment_of, alignment_axes.set_cache_alignment),
)
AXIS = {axis.name: axis for axis in AXES}
# Axes of the other kinds of case, by case type, filled where that kind is declared (the compile-pass
# ``CompileCase``: ``compile_passes/axes.py``, which also adds them to ``AXIS``; no name shared with ``AXES``).
OTHER_AXES: dict[type, tuple[Axis, ...]] = {}


def axes_for(rotates: bool) -> tuple[Axis, ...]:
    """The axes of an operation's cases (the unfused cache writes do not rotate)."""
    return tuple(axis for axis in AXES if rotates or not axis.rope_only)


def axes_of(case, rotates: bool = True) -> tuple[Axis, ...]:
    """The axes ``case``'s kind has: ``axes_for(rotates)`` for a kernel case, its registered ones else."""
    if isinstance(case, (RopeCase, MlaCase, FlashCase)):
        return axes_for(rotates)
    return OTHER_AXES.get(type(case), ())


def features(case, rotates: bool = True) -> dict[str, str]:
    """``{axis name: value}`` for every axis that applies to ``case`` under an operation that
    rotates (``rotates``) or only writes the cache; a case of another kind (a compile-pass
    ``CompileCase``) on the axes declared for it in ``OTHER_AXES``, else ``{}``."""
    found = {}
    for axis in axes_of(case, rotates):
        value = axis.of(case)
        if value is not None:
            found[axis.name] = value
    return found


def describe(cell: dict[str, str]) -> str:
    """``query rank 3, heads >1`` (in the order of ``AXIS``)."""
    order = {name: index for index, name in enumerate(AXIS)}
    return ", ".join(f"{name} {cell[name]}" for name in sorted(cell, key=lambda name: order.get(name, len(order)))
                     ) or "(any case)"
