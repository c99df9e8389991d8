"""Where a case is on each feature axis of its cache (cache dtype, fp8 storage, cache layout and
order, value head size, scales, padding, the slot mapping's length, dtype and layout), and moving it to
another value: ``<axis>_of(case)`` and ``set_<axis>(case, value)``, as in ``input_axes.py``.
"""

from __future__ import annotations

import dataclasses

from mla_fuse_conformance.cases.input_axes import is_rope
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, ScaleSpec
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES, FP8_CACHE_DTYPES

replace = dataclasses.replace


def kv_cache_dtype_of(case):
    return None if is_rope(case) else case.kv_cache_dtype


def set_kv_cache_dtype(case, value):
    if value in FLOAT_DTYPES and value != case.dtype:
        return None
    storage = case.cache_storage if case.cache_storage != "source" else "uint8"
    return replace(case, kv_cache_dtype=value, cache_storage=storage if value in FP8_CACHE_DTYPES else "source")


def fp8_storage_of(case):
    if is_rope(case) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    return case.cache_storage


def set_fp8_storage(case, value):
    return replace(case, cache_storage=value)


def cache_layout_of(case):
    if is_rope(case):
        return None
    if getattr(case, "kv_form", "split") != "split":
        return "K and V in one pool"
    return "contiguous" if case.cache_place.is_plain() else "view into a pool"


def set_cache_layout(case, value):
    if value == "view into a pool":
        return None
    if value == "K and V in one pool":
        return replace(case, kv_form="flashinfer", value_head_size=case.head_size) if isinstance(case, FlashCase) else None
    return replace(case, cache_place=Placement(), kv_form="split") if isinstance(case, FlashCase) else \
        replace(case, cache_place=Placement())


CACHE_ORDERS = {(0, 1, 2): "NHD", (0, 2, 1): "HND"}


def cache_order_of(case):
    return CACHE_ORDERS.get(tuple(case.cache_order), "other") if isinstance(case, FlashCase) else None


def set_cache_order(case, value):
    orders = {name: order for order, name in CACHE_ORDERS.items()}
    return replace(case, cache_order=orders[value]) if value in orders else None


def value_head_size_of(case):
    if not isinstance(case, FlashCase):
        return None
    return "Dv = D" if case.value_head_size == case.head_size else "Dv != D"


def set_value_head_size(case, value):
    if value == "Dv = D":
        return replace(case, value_head_size=case.head_size)
    return replace(case, value_head_size=case.head_size + 1, kv_form="split")


def per_head_scales_of(case):
    if not isinstance(case, FlashCase) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    return "yes" if case.k_scale.per_head or case.v_scale.per_head else "no"


def set_per_head_scales(case, value):
    if value == "yes":
        return replace(case, k_scale=replace(case.k_scale, per_head=True))
    return replace(case, k_scale=replace(case.k_scale, per_head=False), v_scale=replace(case.v_scale, per_head=False))


def scale_of(case):
    if is_rope(case) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    scales = (case.scale,) if isinstance(case, MlaCase) else (case.k_scale, case.v_scale)
    return "1" if all(s.log2 == 0 and s.mantissa == 1 for s in scales) else "other"


def set_scale(case, value):
    if value != "1":
        return None
    if isinstance(case, MlaCase):
        return replace(case, scale=ScaleSpec())
    return replace(case, k_scale=ScaleSpec(per_head=case.k_scale.per_head),
                   v_scale=ScaleSpec(per_head=case.v_scale.per_head))


def kv_scales_of(case):
    if not isinstance(case, FlashCase) or case.kv_cache_dtype not in FP8_CACHE_DTYPES:
        return None
    return "equal" if case.k_scale == case.v_scale else "differ"


def set_kv_scales(case, value):
    if value == "equal":
        return replace(case, v_scale=case.k_scale)
    return replace(case, v_scale=replace(case.k_scale, log2=case.k_scale.log2 + 1))


def padding_of(case):
    return None if is_rope(case) else case.slots.padding


def set_padding(case, value):
    return replace(case, slots=replace(case.slots, padding=value))


def slot_length_of(case):
    if is_rope(case):
        return None
    return "= T" if case.slots.length == case.tokens else "< T"


def set_slot_length(case, value):
    if value == "< T":
        return replace(case, slots=replace(case.slots, length=case.tokens - 1)) if case.tokens else None
    return replace(case, slots=replace(case.slots, length=case.tokens))


def slot_dtype_of(case):
    return None if is_rope(case) else case.slots.dtype


def set_slot_dtype(case, value):
    return replace(case, slots=replace(case.slots, dtype=value))


def slots_layout_of(case):
    return None if is_rope(case) else "strided" if case.slots.stride > 1 else "contiguous"


def set_slots_layout(case, value):
    return replace(case, slots=replace(case.slots, stride=1 if value == "contiguous" else 2))
