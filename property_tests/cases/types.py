"""What a property example is: plain, frozen parameters plus a seed.

A case holds no tensor. ``tensors.py`` turns a case into tensors, deterministically
from its ``seed``, so a case is all a failure needs to be replayed: it is what
hypothesis draws, what ``repr`` shows (valid Python, ready to paste into an
``@example``), and what a saved failure file stores (``to_json``/``from_json``).

Names follow CONTRACT: ``tokens`` T, ``heads`` H, ``kv_heads`` Hkv, ``head_size`` D,
``rotary_dim`` R, ``latent`` L, ``num_blocks`` NB, ``block_size`` B, table rows P.
"""

from __future__ import annotations

import dataclasses
import json
import typing


class _Compact:
    """``repr`` shows only the fields that differ from their defaults (still valid Python)."""

    def __repr__(self) -> str:
        shown = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.default is not dataclasses.MISSING and value == field.default:
                continue
            shown.append(f"{field.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"


@dataclasses.dataclass(frozen=True, repr=False)
class TableSpec(_Compact):
    """A cos/sin table ``[P, R]`` built by ``reference.rope``.

    ``style``: ``"plain"`` (P = ``max_position``) or ``"deepseek_yarn"``
    (P = ``max_position * yarn_factor``, ``max_position`` being the original one).
    ``dtype``: ``"float32"`` or ``"input"`` (the activations' dtype).
    ``poison_unused_rows``: rows no token reads hold NaN, so reading a wrong
    row shows; only the rows read are computed (how large tables stay cheap).
    """

    style: str
    rotary_dim: int
    max_position: int
    dtype: str = "float32"
    base: float = 10000.0
    yarn_factor: float = 1.0
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    yarn_attn_factor: float = 1.0
    poison_unused_rows: bool = False

    @property
    def num_positions(self) -> int:
        if self.style == "plain":
            return self.max_position
        return int(self.max_position * self.yarn_factor)


@dataclasses.dataclass(frozen=True, repr=False)
class PositionSpec(_Compact):
    """``positions[T]``: ``pattern`` is ``uniform`` (any row), ``prefill`` (consecutive),
    ``last_rows`` (near P - 1, P - 1 included) or ``zeros``; ``stride`` > 1 makes it a
    strided view whose gaps and tail hold other valid positions."""

    dtype: str = "int64"
    pattern: str = "uniform"
    stride: int = 1


@dataclasses.dataclass(frozen=True, repr=False)
class SlotSpec(_Compact):
    """``slot_mapping[length]`` (``length <= T``): ``padding`` is ``none``, ``some`` or ``all``;
    padded entries hold ``pad_value`` (< 0). Valid slots are distinct; ``placement`` is
    ``random``, ``prefill`` (consecutive from a random slot), ``extremes`` (the cache's first and last
    slot among them), ``per_block`` (each in its own block, a decode batch) or ``mid_block``
    (consecutive from ``block_size // 2``, a prefill chunk). The storage past its end (and between entries
    when ``stride`` > 1) holds unused *valid* slots: reading past the end writes visibly."""

    length: int
    padding: str = "none"
    pad_fraction: float = 0.5
    pad_value: int = -1
    placement: str = "random"
    dtype: str = "int64"
    stride: int = 1


@dataclasses.dataclass(frozen=True, repr=False)
class Placement(_Compact):
    """Where a tensor lives in its allocation: a strided view of a larger parent.

    The parent has, per dim, ``pad[d]`` more entries than the view, and the view starts
    at ``offset[d]`` (``<= pad[d]``). ``order`` lists the dims outermost first (the last
    dim stays innermost, stride 1); empty means row-major. ``lead`` elements precede the
    parent in storage (a storage offset); ``trail`` follow it. Everything outside the view
    is sentinel memory that must stay bit-for-bit as it was.
    """

    pad: tuple[int, ...] = ()
    offset: tuple[int, ...] = ()
    order: tuple[int, ...] = ()
    lead: int = 0
    trail: int = 0

    def is_plain(self) -> bool:
        return not any(self.pad) and not any(self.offset) and not self.lead and not self.trail and (
            not self.order or list(self.order) == sorted(self.order))


@dataclasses.dataclass(frozen=True, repr=False)
class ValueSpec(_Compact):
    """Activation values: ``N(0, 1) * 2^log2_magnitude * 2^U(-spread, spread)``, then
    ``nan_count`` NaNs, and (fp8 caches) ``midpoint_fraction`` of the elements moved onto
    or next to fp8 rounding midpoints of ``x / scale``; ``sign``: ``any``, or every value made
    ``non-negative`` or ``non-positive`` (its magnitude kept: never drawn, the map moves a failing
    case there to tell whether its failure needs a sign, ``conformance_map/holds.py``)."""

    log2_magnitude: float = 0.0
    log2_spread: float = 2.0
    nan_count: int = 0
    midpoint_fraction: float = 0.0
    sign: str = "any"


@dataclasses.dataclass(frozen=True, repr=False)
class ScaleSpec(_Compact):
    """A fp32 scale ``mantissa * 2^log2``; ``per_head``: ``[Hkv]`` values that differ per head."""

    log2: float = 0.0
    mantissa: float = 1.0
    per_head: bool = False


@dataclasses.dataclass(frozen=True, repr=False)
class RopeCase(_Compact):
    """``rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)``.

    ``query [T, H, D]`` (``rank`` 3) or ``[T, H*D]`` (``rank`` 2); ``key`` likewise with
    ``kv_heads`` heads, or ``None`` when ``kv_heads`` is 0. ``qkv_packed``: both are column
    slices of one ``[T, (H + Hkv) * D + extra]`` projection output.
    """

    seed: int
    tokens: int
    heads: int
    kv_heads: int
    head_size: int
    dtype: str
    is_neox: bool
    table: TableSpec
    positions: PositionSpec = PositionSpec()
    rank: int = 3
    qkv_packed: bool = False
    query_place: Placement = Placement()
    key_place: Placement = Placement()
    values: ValueSpec = ValueSpec()
    check_values: bool = False


@dataclasses.dataclass(frozen=True, repr=False)
class MlaCase(_Compact):
    """The MLA operations: ``concat_and_cache_mla`` and ``concat_and_cache_mla_rope_fused``.

    ``q_pe [T, H, R]`` is ``q[..., nope:]`` of ``q [T, H, nope + R]`` (``q_place.offset[2]``
    is ``nope``); ``kv_c [T, L]`` and ``k_pe [T, R]`` are column slices of one
    ``[T, L + R]`` tensor placed by ``kv_c_place`` when ``kv_packed``, else each placed on its
    own (``kv_c_place``, ``k_pe_place``: vLLM passes a contiguous kv_c and a k_pe sliced
    from a wider projection); ``kv_cache [NB, B, L + R]`` is a view
    placed in a pool by ``cache_place``, stored as ``cache_storage`` (``"source"``,
    ``"uint8"`` or ``"float8"``).
    """

    seed: int
    tokens: int
    heads: int
    latent: int
    rotary_dim: int
    dtype: str
    kv_cache_dtype: str
    num_blocks: int
    block_size: int
    slots: SlotSpec
    table: TableSpec
    is_neox: bool = False
    cache_storage: str = "source"
    positions: PositionSpec = PositionSpec()
    q_place: Placement = Placement()
    kv_packed: bool = True
    kv_c_place: Placement = Placement()
    k_pe_place: Placement = Placement()
    cache_place: Placement = Placement()
    values: ValueSpec = ValueSpec()
    scale: ScaleSpec = ScaleSpec()
    check_values: bool = False


@dataclasses.dataclass(frozen=True, repr=False)
class FlashCase(_Compact):
    """The MHA operations: ``reshape_and_cache_flash`` and ``rope_and_reshape_and_cache_flash``.

    ``query [T, H, D]``, ``key [T, Hkv, D]``, ``value [T, Hkv, Dv]``: column slices of one
    packed qkv when ``qkv_packed``, else each placed on its own. Caches ``[NB, B, Hkv, D|Dv]``
    in the memory order ``cache_order`` (``(0, 1, 2)`` is NHD, ``(0, 2, 1)`` HND), each a view
    placed in a pool; ``kv_form`` (``layout_types.KV_FORMS``) says how K and V share it:
    ``split`` two allocations, or (D == Dv) one: ``flash`` ``[2, NB, ..]``, ``flashinfer``
    ``[NB, 2, ..]``, ``halves`` the two halves of each head's ``2D`` row.
    The table's rotary width R may be smaller than D (partial rotary).
    """

    seed: int
    tokens: int
    heads: int
    kv_heads: int
    head_size: int
    value_head_size: int
    dtype: str
    kv_cache_dtype: str
    num_blocks: int
    block_size: int
    slots: SlotSpec
    table: TableSpec
    is_neox: bool = True
    cache_storage: str = "source"
    cache_order: tuple[int, ...] = (0, 1, 2)
    kv_form: str = "split"
    positions: PositionSpec = PositionSpec()
    qkv_packed: bool = False
    query_place: Placement = Placement()
    key_place: Placement = Placement()
    value_place: Placement = Placement()
    cache_place: Placement = Placement()
    values: ValueSpec = ValueSpec()
    value_values: ValueSpec = ValueSpec()
    k_scale: ScaleSpec = ScaleSpec()
    v_scale: ScaleSpec = ScaleSpec()
    check_values: bool = False


@dataclasses.dataclass(frozen=True, repr=False)
class BadInputCase(_Compact):
    """A valid ``base`` case for ``operation`` with one ``corruption`` (see ``corruptions.py``)."""

    operation: str
    corruption: str
    base: typing.Union[RopeCase, MlaCase, FlashCase]


CASE_TYPES = {cls.__name__: cls for cls in (
    TableSpec, PositionSpec, SlotSpec, Placement, ValueSpec, ScaleSpec, RopeCase, MlaCase, FlashCase,
    BadInputCase)}


# ---------------------------------------------------------------- JSON


def to_jsonable(case) -> dict:
    """A JSON-ready dict; nested cases carry their type name under ``"type"``."""
    out = {"type": type(case).__name__}
    for field in dataclasses.fields(case):
        value = getattr(case, field.name)
        if dataclasses.is_dataclass(value):
            value = to_jsonable(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[field.name] = value
    return out


# fields renamed since files were written: old name -> the new fields its (decoded) value gives
LEGACY_FIELDS = {
    "kv_place": lambda place: dict(kv_c_place=place, k_pe_place=place),  # saved cases of the earlier layout: one placement for both
    "shared_pool": lambda shared: dict(kv_form="flashinfer" if shared else "split"),
}


def from_jsonable(data: dict):
    """Inverse of ``to_jsonable`` (files written before a field was renamed read as they were meant)."""
    cls = CASE_TYPES[data["type"]]
    hints = typing.get_type_hints(cls)
    for old, renamed in LEGACY_FIELDS.items():
        if old in data and old not in hints:
            value = data[old]
            data = {**renamed(from_jsonable(value) if isinstance(value, dict) else value), **data}
    kwargs = {}
    for field in dataclasses.fields(cls):
        if field.name not in data:
            continue  # a field added since the file was written keeps its default
        value = data[field.name]
        if isinstance(value, dict) and "type" in value:
            value = from_jsonable(value)
        elif isinstance(value, list) and typing.get_origin(hints[field.name]) is tuple:
            value = tuple(value)
        kwargs[field.name] = value
    return cls(**kwargs)


def to_json(case) -> str:
    return json.dumps(to_jsonable(case), sort_keys=True)


def from_json(text: str):
    return from_jsonable(json.loads(text))
