"""What an implementation supports: declared limits, in the style of PyTorch's OpInfo.

An adapter declares ``capabilities``: one ``Capabilities`` for every operation, or a dict from
operation name to ``Capabilities`` (operations not named get the defaults). A plain dict of field
values is accepted in place of ``Capabilities`` so an adapter need not import the suite. The
defaults are everything the contract allows, so an adapter that declares nothing is held to the
whole contract.

The correctness properties draw only cases inside the declared limits (a drawn case is moved
onto them axis by axis, ``features.Axis.set``). ``mla-fuse verify`` prints the limits and checks
that each is real: a few cases just outside a limit are run; one that fails confirms the limit,
one that passes is noted ("declared unsupported, but handled"). A restriction that is not
declared is a failure like any other, reported with what the kernel raised.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from mla_fuse_conformance.cases.types import FlashCase, MlaCase
from mla_fuse_conformance.cases.features import AXES, AXIS, axes_for, features
from mla_fuse_conformance.cases.fields import valid
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES, FP8_STORAGES, INDEX_DTYPES, KV_CACHE_DTYPES
from mla_fuse_conformance.declarations.operations import OPERATIONS

TABLE_POLICIES = ("any", "input", "float32")


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Declared limits of one operation. Every field's default is the whole contract."""

    dtypes: tuple[str, ...] = FLOAT_DTYPES  # activations: q, k, v, kv_c
    table_dtypes: str = "any"  # cos_sin_cache: "any", "input" (must equal the activations' dtype), "float32"
    position_dtypes: tuple[str, ...] = INDEX_DTYPES
    slot_dtypes: tuple[str, ...] = INDEX_DTYPES
    strided_index_tensors: bool = True  # positions / slot_mapping as strided views
    styles: tuple[str, ...] = ("neox", "gptj")  # is_neox True / False
    query_ranks: tuple[int, ...] = (3, 2)  # rotary_embedding: [T, H, D] and [T, H * D]
    key_optional: bool = True  # rotary_embedding(..., key=None, ...)
    gqa: bool = True  # MHA: fewer KV heads than query heads
    partial_rotary: bool = True  # R < D: the tail of each head passes through
    input_layouts: tuple[str, ...] = ("contiguous", "packed", "strided")  # q/k/v/kv_c tensors
    unpacked_heads: bool = True  # rope/MHA inputs whose heads are another stride than D apart ("head stride other")
    distinct_value_head_size: bool = True  # MHA: Dv != D
    kv_cache_dtypes: tuple[str, ...] = KV_CACHE_DTYPES
    fp8_storage: tuple[str, ...] = FP8_STORAGES  # fp8 caches as torch.uint8 / torch.float8_*
    per_head_scales: bool = True  # MHA: k_scale / v_scale of shape [Hkv]
    scales: tuple[str, ...] = ("1", "other")  # fp8 scale values: only 1, or any
    distinct_kv_scales: bool = True  # MHA fp8: k_scale != v_scale
    padding: tuple[str, ...] = ("none", "some", "all")  # slots < 0 in slot_mapping
    short_slot_mapping: bool = True  # len(slot_mapping) < T (graph padding)
    cache_layouts: tuple[str, ...] = ("contiguous", "view into a pool", "K and V in one pool")
    cache_orders: tuple[str, ...] = ("NHD", "HND", "other")  # flash caches' dim order in memory
    empty_batch: bool = True  # T = 0
    nan_inputs: bool = True  # NaN in the activations propagates (and encodes as fp8 NaN)
    # sizes a kernel is built for (None: any); a drawn size outside moves to the nearest listed one
    head_sizes: tuple[int, ...] | None = None  # D (and Dv) of rotary_embedding and the MHA operations
    rotary_dims: tuple[int, ...] | None = None  # R, the table's width
    latent_dims: tuple[int, ...] | None = None  # L of the MLA operations
    block_sizes: tuple[int, ...] | None = None  # B of the cache-writing operations
    # what a padded token's slot holds: -1, a negative slot (CONTRACT §2), or a reserved slot r >= 0 (SGLang's 0):
    # padded tokens then point at r, no real token is given r, and slot r's contents are not judged
    padding_slot: int = -1

    def __post_init__(self) -> None:
        if self.table_dtypes not in TABLE_POLICIES:
            raise ValueError(f"capabilities: table_dtypes must be one of {TABLE_POLICIES}, got {self.table_dtypes!r}")
        if not isinstance(self.padding_slot, int) or isinstance(self.padding_slot, bool) or self.padding_slot < -1:
            raise TypeError(f"capabilities: padding_slot must be -1 (negative slots) or a reserved slot >= 0, "
                            f"got {self.padding_slot!r}")
        for name in ("head_sizes", "rotary_dims", "latent_dims", "block_sizes"):
            sizes = getattr(self, name)
            if sizes is not None:
                if isinstance(sizes, int) or not all(isinstance(size, int) and size > 0 for size in sizes) or not sizes:
                    raise TypeError(f"capabilities: {name} must be a non-empty tuple of positive ints, got {sizes!r}")
                object.__setattr__(self, name, tuple(sorted(sizes)))
        for name in ("dtypes", "position_dtypes", "slot_dtypes", "styles", "query_ranks", "input_layouts",
                     "kv_cache_dtypes", "fp8_storage", "cache_layouts", "cache_orders", "scales", "padding"):
            declared = getattr(self, name)
            if isinstance(declared, str) or not isinstance(declared, Iterable):
                raise TypeError(f"capabilities: {name} must be a tuple of values, got {declared!r}")
            object.__setattr__(self, name, tuple(declared))
            unknown = set(map(str, declared)) - set(map(str, getattr(CONTRACT, name)))
            if unknown:
                raise ValueError(f"capabilities: {name} has {sorted(unknown)}, not values of the contract "
                                 f"{tuple(getattr(CONTRACT, name))}")

    # ------------------------------------------------------------ per axis

    def allowed(self, axis: str, case) -> tuple[str, ...]:
        """The values of ``axis`` this declaration allows (for ``case``: the table policy depends on it)."""
        everything = AXIS[axis].values
        flag = {"key": ("none", self.key_optional), "GQA": ("H > Hkv", self.gqa),
                "rotary": ("partial", self.partial_rotary),
                "value head size": ("Dv != D", self.distinct_value_head_size),
                "per-head scales": ("yes", self.per_head_scales), "tokens": ("0", self.empty_batch),
                "K, V scales": ("differ", self.distinct_kv_scales),
                "slot_mapping length": ("< T", self.short_slot_mapping),
                "NaN inputs": ("yes", self.nan_inputs), "positions layout": ("strided", self.strided_index_tensors),
                "slot_mapping layout": ("strided", self.strided_index_tensors),
                "head stride": ("other", self.unpacked_heads)}
        if axis in flag:
            value, allowed = flag[axis]
            return everything if allowed else tuple(v for v in everything if v != value)
        listed = {"dtype": self.dtypes, "positions dtype": self.position_dtypes, "slot_mapping dtype": self.slot_dtypes,
                  "style": self.styles, "query rank": tuple(map(str, self.query_ranks)),
                  "inputs": self.input_layouts, "kv_cache_dtype": self.kv_cache_dtypes,
                  "fp8 storage": self.fp8_storage, "cache layout": self.cache_layouts,
                  "cache order": self.cache_orders, "scale": self.scales, "padding": self.padding}
        if axis in listed:
            return tuple(v for v in everything if v in listed[axis])
        if axis == "table dtype":
            if self.table_dtypes == "any" or (case is not None and case.dtype == "float32"):
                return everything
            return ("input dtype",) if self.table_dtypes == "input" else ("float32",)
        return everything

    def violations(self, case, rotates: bool = True) -> dict[str, str]:
        """The axes (and sizes) on which ``case`` is outside these limits, with its value there."""
        found = {name: value for name, value in features(case, rotates).items()
                 if value not in self.allowed(name, case)}
        for name, (field, value) in sizes_of(case, rotates).items():
            allowed = getattr(self, field)
            if allowed is not None and value not in allowed:
                found[name] = str(value)
        pad = pad_value_of(case)  # a case that pads no token is inside either declaration
        if (pad is not None and case.slots.padding != "none" and (pad >= 0 or self.padding_slot >= 0)
                and pad != self.padding_slot):
            found["padding slot"] = str(pad)
        return found

    def allows(self, case, rotates: bool = True) -> bool:
        return not self.violations(case, rotates)

    def project(self, case, rotates: bool = True):
        """``case`` moved onto these limits axis by axis (other features kept where possible), or
        None where some axis cannot be moved (the example is then rejected)."""
        case = self._fit_sizes(case, rotates)
        if pad_value_of(case) is not None and self.padding_slot >= 0:
            case = dataclasses.replace(case, slots=dataclasses.replace(case.slots, pad_value=self.padding_slot))
        for _ in range(2):  # moving one axis can move another (dtype and a named cache dtype)
            for axis in axes_for(rotates):
                value = axis.of(case)
                if value is None or value in self.allowed(axis.name, case):
                    continue
                moved = next((m for v in self.allowed(axis.name, case) if (m := axis.set(case, v)) is not None),
                             None)
                if moved is None:
                    return None
                case = moved
            if self.allows(case, rotates):
                return case if valid(case) else None  # not one the builders lay out (a one-pool Dv != D)
        return None

    def _fit_sizes(self, case, rotates: bool):
        """``case`` with each declared size moved to the nearest size listed for it."""
        def nearest(sizes, size):
            return size if sizes is None or size in sizes else min(sizes, key=lambda s: (abs(s - size), s))

        if hasattr(case, "block_size") and self.block_sizes is not None and case.block_size not in self.block_sizes:
            block_size = nearest(self.block_sizes, case.block_size)  # as many slots or more
            case = dataclasses.replace(case, block_size=block_size,
                                       num_blocks=-(-case.num_blocks * case.block_size // block_size))
        if isinstance(case, MlaCase):  # R is k_pe's width whether or not the operation rotates
            rotary_dim = nearest(self.rotary_dims, case.rotary_dim)
            return dataclasses.replace(case, latent=nearest(self.latent_dims, case.latent), rotary_dim=rotary_dim,
                                       table=dataclasses.replace(case.table, rotary_dim=rotary_dim))
        head_size = nearest(self.head_sizes, case.head_size)
        fields = {"head_size": head_size}
        if isinstance(case, FlashCase):
            fields["value_head_size"] = nearest(self.head_sizes, case.value_head_size)
        if rotates:
            rotary_dim = nearest(self.rotary_dims, min(case.table.rotary_dim, head_size))
            if rotary_dim > head_size or rotary_dim % 2:
                return case  # no listed width fits: left for violations() to reject
            fields["table"] = dataclasses.replace(case.table, rotary_dim=rotary_dim)
        return dataclasses.replace(case, **fields)

    def restrictions(self, rotates: bool = True) -> dict[str, tuple[str, ...]]:
        """Axis -> the contract's values this declaration leaves out (the declared limits)."""
        out = {}
        for axis in axes_for(rotates):
            left_out = tuple(v for v in axis.values if v not in self.allowed(axis.name, None))
            if axis.name == "table dtype" and self.table_dtypes != "any":
                left_out = ("float32",) if self.table_dtypes == "input" else ("input dtype",)
            if left_out:
                out[axis.name] = left_out
        return out

    def only(self, axis: str, value: str) -> "Capabilities":
        """These limits with ``axis`` pinned to ``value`` (which may be outside them): the cases a
        limit check runs."""
        return _Pinned(self, axis, value)

    def describe(self, rotates: bool = True) -> list[str]:
        """One line per declared limit, e.g. ``kv_cache_dtype: not fp8, fp8_e4m3, fp8_e5m2``."""
        lines = [f"{axis}: not {', '.join(values)}" for axis, values in self.restrictions(rotates).items()]
        for field, label in SIZE_FIELDS.items():
            if getattr(self, field) is not None:
                lines.append(f"{label}: only {', '.join(map(str, getattr(self, field)))}")
        if self.padding_slot >= 0:
            lines.append(f"padding slot: reserved slot {self.padding_slot}, not -1 (padded tokens point at it; its "
                         "contents are not judged)")
        return lines


SIZE_FIELDS = {"head_sizes": "head size", "rotary_dims": "rotary width", "latent_dims": "latent width",
               "block_sizes": "block size"}


def pad_value_of(case) -> int | None:
    """What ``case``'s padded slots hold (None: a case without a slot mapping)."""
    slots = getattr(case, "slots", None)
    return None if slots is None else slots.pad_value


def sizes_of(case, rotates: bool) -> dict[str, tuple[str, int]]:
    """The sizes a declaration may restrict: label -> (Capabilities field, size)."""
    blocks = {"block size": ("block_sizes", case.block_size)} if hasattr(case, "block_size") else {}
    if isinstance(case, MlaCase):
        return {"latent width": ("latent_dims", case.latent), "rotary width": ("rotary_dims", case.rotary_dim),
                **blocks}
    found = {"head size": ("head_sizes", case.head_size), **blocks}
    if isinstance(case, FlashCase):
        found["value head size"] = ("head_sizes", case.value_head_size)
    if rotates:
        found["rotary width"] = ("rotary_dims", case.table.rotary_dim)
    return found


CONTRACT = Capabilities.__new__(Capabilities)
for _field in dataclasses.fields(Capabilities):
    object.__setattr__(CONTRACT, _field.name, _field.default)


class _Pinned(Capabilities):
    """A ``Capabilities`` with one axis pinned to one value (see ``Capabilities.only``)."""

    def __init__(self, base: Capabilities, axis: str, value: str) -> None:  # noqa: D107 - no dataclass init
        for field in dataclasses.fields(Capabilities):
            object.__setattr__(self, field.name, getattr(base, field.name))
        object.__setattr__(self, "_pin", (axis, value))

    def allowed(self, axis: str, case) -> tuple[str, ...]:
        pinned_axis, value = self._pin
        return (value,) if axis == pinned_axis else super().allowed(axis, case)


def from_declaration(declared: Any, spec: str) -> dict[str, Capabilities]:
    """Operation -> Capabilities from an adapter's ``capabilities`` attribute (see the module docstring)."""
    if declared is None:
        return {op: CONTRACT for op in OPERATIONS}
    if isinstance(declared, Capabilities):
        return {op: declared for op in OPERATIONS}
    if not isinstance(declared, Mapping):
        raise TypeError(f"implementation {spec!r}: capabilities must be a Capabilities, a dict of its fields, or a "
                        f"dict from operation name to either; got {type(declared).__name__}")
    if set(declared) <= set(OPERATIONS):
        return {op: _one(declared.get(op), spec, op) for op in OPERATIONS}
    return {op: _one(declared, spec, "every operation") for op in OPERATIONS}


def _one(declared: Any, spec: str, where: str) -> Capabilities:
    if declared is None:
        return CONTRACT
    if isinstance(declared, Capabilities):
        return declared
    if isinstance(declared, Mapping):
        known = {field.name for field in dataclasses.fields(Capabilities)}
        unknown = sorted(set(declared) - known)
        if unknown:
            raise ValueError(f"implementation {spec!r}: capabilities of {where} name unknown fields {unknown}; "
                             f"known: {sorted(known)} (or operation names: {list(OPERATIONS)})")
        return Capabilities(**declared)
    raise TypeError(f"implementation {spec!r}: capabilities of {where} must be a Capabilities or a dict")


__all__ = ["AXES", "CONTRACT", "Capabilities", "TABLE_POLICIES", "from_declaration"]
