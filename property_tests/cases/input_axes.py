"""Where a case is on each feature axis of its inputs (dtypes, the rope table, positions,
ranks, heads, key, rotary part, GQA, memory layout, tokens, NaNs), and moving it to another
value: ``<axis>_of(case)`` (None where the axis does not apply) and ``set_<axis>(case, value)`` (None
where the value cannot be reached from this case). The axes themselves are declared in ``features.py``.
"""

from __future__ import annotations

import dataclasses

from mla_fuse_conformance.cases.memory import placed_geometry
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES

replace = dataclasses.replace


def is_rope(case) -> bool:
    return isinstance(case, RopeCase)


def dtype_of(case):
    return case.dtype


def set_dtype(case, value):
    named = getattr(case, "kv_cache_dtype", None) in FLOAT_DTYPES
    moved = replace(case, dtype=value)
    return replace(moved, kv_cache_dtype=value) if named else moved


def table_dtype_of(case):
    return "input dtype" if case.table.dtype == "input" and case.dtype != "float32" else "float32"


def set_table_dtype(case, value):
    return replace(case, table=replace(case.table, dtype="input" if value == "input dtype" else "float32"))


def positions_dtype_of(case):
    return case.positions.dtype


def set_positions_dtype(case, value):
    return replace(case, positions=replace(case.positions, dtype=value))


def positions_layout_of(case):
    return "strided" if case.positions.stride > 1 else "contiguous"


def set_positions_layout(case, value):
    return replace(case, positions=replace(case.positions, stride=1 if value == "contiguous" else 2))


def style_of(case):
    return "neox" if case.is_neox else "gptj"


def set_style(case, value):
    return replace(case, is_neox=value == "neox")


def tokens_of(case):
    return "0" if case.tokens == 0 else "1" if case.tokens == 1 else "2-16" if case.tokens <= 16 else ">16"


def nan_of(case):
    return "yes" if case.values.nan_count else "no"


def set_nan(case, value):
    moved = replace(case, values=replace(case.values, nan_count=1 if value == "yes" else 0))
    if hasattr(moved, "value_values") and value == "no":
        moved = replace(moved, value_values=replace(moved.value_values, nan_count=0))
    return moved


def query_rank_of(case):
    return str(case.rank) if is_rope(case) else None


def _rank_placement(place: Placement, rank: int) -> Placement:
    if not place.pad:
        return place
    pad, offset = (place.pad[0], max(place.pad[1:])), (place.offset[0], min(place.offset[-1], max(place.pad[1:])))
    if rank == 3:
        pad, offset = (pad[0], 0, pad[1]), (offset[0], 0, offset[1])
    return replace(place, pad=pad, offset=offset, order=())


def set_query_rank(case, value):
    rank = int(value)
    packed = case.qkv_packed  # a packed buffer's placement has rank 2 whatever the query's rank
    return replace(case, rank=rank, query_place=case.query_place if packed else _rank_placement(case.query_place, rank),
                   key_place=case.key_place if packed else _rank_placement(case.key_place, rank))


def heads_of(case):
    return "1" if case.heads == 1 else ">1"


def set_heads(case, value):
    if isinstance(case, FlashCase):  # H = Hkv is kept; H > Hkv (GQA) is its own axis
        return replace(case, heads=1, kv_heads=1) if value == "1" else replace(case, heads=2 * case.heads,
                                                                               kv_heads=2 * case.kv_heads)
    return replace(case, heads=1 if value == "1" else 2)


def key_of(case):
    return ("present" if case.kv_heads else "none") if is_rope(case) else None


def set_key(case, value):
    return replace(case, kv_heads=1 if value == "present" else 0, key_place=Placement())


def key_heads_of(case):
    if is_rope(case):
        return None if not case.kv_heads else "1" if case.kv_heads == 1 else ">1"
    return "1" if isinstance(case, FlashCase) and case.kv_heads == 1 else ">1" if isinstance(case, FlashCase) else None


def set_key_heads(case, value):
    kv_heads = 1 if value == "1" else 2
    if isinstance(case, FlashCase):
        return replace(case, kv_heads=kv_heads, heads=kv_heads * max(case.heads // case.kv_heads, 1))
    return replace(case, kv_heads=kv_heads)


def rotary_of(case):
    if isinstance(case, MlaCase):
        return None  # MLA's q_pe/k_pe are exactly R wide: always full
    return "partial" if case.table.rotary_dim < case.head_size else "full"


def set_rotary(case, value):
    rotary_dim = case.table.rotary_dim
    head_size = rotary_dim if value == "full" else rotary_dim + 2
    if isinstance(case, FlashCase) and case.value_head_size == case.head_size:  # Dv = D kept (a one-pool cache)
        return replace(case, head_size=head_size, value_head_size=head_size)
    return replace(case, head_size=head_size)


def gqa_of(case):
    if not isinstance(case, FlashCase):
        return None
    return "H > Hkv" if case.heads > case.kv_heads else "H = Hkv"


def set_gqa(case, value):
    return replace(case, heads=case.kv_heads * (2 if value == "H > Hkv" else 1))


def inputs_of(case):
    if is_rope(case):
        return "packed" if case.qkv_packed else _placements_kind((case.query_place, case.key_place))
    if isinstance(case, MlaCase):
        if case.kv_packed:
            return "packed"
        return _placements_kind((case.q_place, case.kv_c_place, case.k_pe_place))
    if case.qkv_packed:
        return "packed"
    return _placements_kind((case.query_place, case.key_place, case.value_place))


def _placements_kind(places) -> str:
    """``contiguous`` (every input plain) or ``strided`` (some input strided, sliced or offset, each
    placed on its own: the map names which through the fields ``<input>_place.*``)."""
    return "contiguous" if all(place.is_plain() for place in places) else "strided"


def _headed_inputs(case) -> dict[str, tuple[tuple[int, int, int], Placement]] | None:
    """``{field: ([T, heads, size], placement)}`` of each input with a heads dim that a rope (rank 3) or MHA case
    places on its own; None where the axis "head stride" does not apply (MLA: its q_pe is a slice of each
    head's q, never packed; a rank-2 rope query is rows of ``H * D``)."""
    if isinstance(case, RopeCase):
        if case.rank != 3:
            return None
        found = {"query_place": ((case.tokens, case.heads, case.head_size), case.query_place)}
        if case.kv_heads:
            found["key_place"] = ((case.tokens, case.kv_heads, case.head_size), case.key_place)
        return found
    if isinstance(case, FlashCase):
        return {"query_place": ((case.tokens, case.heads, case.head_size), case.query_place),
                "key_place": ((case.tokens, case.kv_heads, case.head_size), case.key_place),
                "value_place": ((case.tokens, case.kv_heads, case.value_head_size), case.value_place)}
    return None


def _heads_apart(shape, place: Placement) -> bool:
    """Whether a view of ``shape`` ``[T, heads, size]`` placed as ``place`` has more than one head and heads
    other than ``size`` elements apart (its last dim padded, or its outer dims in another memory order)."""
    _, strides, _ = placed_geometry(shape, place)
    return shape[1] > 1 and strides[1] != shape[2]


def head_stride_of(case):
    """``D``: each token's heads packed, one after another (what ``tensor.view(T, H, D)`` of a row gives,
    whatever the row's stride: ``inputs`` contiguous, packed, and strided views that pad only tokens or
    heads); ``other``: some input with more than one head has them another stride apart (an MHA case's
    query counts for the unfused write too, which does not take it, as it does for ``inputs``)."""
    inputs = _headed_inputs(case)
    if inputs is None:
        return None
    if case.qkv_packed:
        return "D"
    return "other" if any(_heads_apart(shape, place) for shape, place in inputs.values()) else "D"


def set_head_stride(case, value):
    """To ``D``: each input's last dim unpadded and its dims in row-major order (the rest of its placement
    kept); ``other`` is the strategies' business (which input, how far apart), as ``inputs: strided`` is."""
    inputs = _headed_inputs(case)
    if value != "D" or inputs is None:
        return None
    packed = {field: replace(place, pad=tuple(place.pad[:2]), offset=tuple(place.offset[:2]), order=())
              for field, (_, place) in inputs.items()}
    return replace(case, **packed)


def set_inputs(case, value):
    if value == "strided":
        return None  # which dims to pad is the strategy's business
    plain = Placement()
    if isinstance(case, MlaCase):
        return replace(case, kv_packed=value == "packed", kv_c_place=plain, k_pe_place=plain, q_place=plain)
    fields = dict(qkv_packed=value == "packed", query_place=plain, key_place=plain)
    if isinstance(case, FlashCase):
        fields["value_place"] = plain
    return replace(case, **fields)
