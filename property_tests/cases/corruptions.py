"""Bad input (CONTRACT §4; the rules: docs/INPUTS.md): one named corruption of a valid argument set per entry.

Each corruption takes the built arguments of a valid case and returns the corrupted
arguments, the argument names an error message may name (any one of them), whether the
check needs ``check_values`` (a device sync: positions past the table, slots past the
cache, duplicate valid slots, fp8 scales that are not finite and positive), and whether
the implementation's graph entry point (``custom_op``, what compiled graphs call without
the wrapper) must reject it too: every corruption but those the ``torch.ops`` dispatcher
itself coerces or rejects (``is_neox=1`` becomes ``True``, a float head size a RuntimeError).

The classes: shapes, dtypes and strides; devices; zero sizes (every size but the token
count must be positive); aliasing (a written argument overlapping another argument or
itself, an expanded view); values (positions, slots, fp8 scales). New tensors are fresh
allocations or views of the case's own buffers that the corruption only reads; the case's
buffers are never modified, so "nothing was written" is a bitwise comparison.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch



class NotApplicable(Exception):
    """This corruption means nothing for this base case (the property discards the example)."""


@dataclasses.dataclass
class Corrupted:
    args: dict
    names: tuple[str, ...]
    check_values: bool = False  # needs the syncing value checks
    direct: bool = True  # the graph entry point (torch.ops) must reject it as well


def _fresh(shape, dtype, device, inner_stride: int = 1) -> torch.Tensor:
    """Ordinary values (a fixed generator), optionally with an innermost stride > 1 (which needs
    an innermost size > 1 to be a different layout at all: the size is bumped to 2 then)."""
    if inner_stride > 1 and shape[-1] < 2:
        raise NotApplicable("an innermost size of 1 has no innermost stride to get wrong")
    values = torch.randn(*shape[:-1], shape[-1] * inner_stride, generator=torch.Generator().manual_seed(7))
    values = values.to(dtype) if dtype.is_floating_point else values.abs().to(dtype)
    return values.to(device)[..., ::inner_stride]


def _other_device(device: torch.device) -> str:
    return "cpu" if device.type != "cpu" else "meta"


def _replace(built, names, check_values=False, **changes) -> Corrupted:
    args = dict(built.args)
    args.update(changes)
    return Corrupted(args, names, check_values)


def _not_for_direct_calls(corrupted: Corrupted) -> Corrupted:
    """The dispatcher of a ``torch.ops`` entry point coerces or rejects this argument itself."""
    return dataclasses.replace(corrupted, direct=False)


def _expanded(tensor: torch.Tensor) -> torch.Tensor:
    """A stride-0 view over the first entry of the first dim (of size > 1): every index, one element."""
    dim = next((d for d, size in enumerate(tensor.shape) if size > 1), None)
    if dim is None:
        raise NotApplicable("no dim of size > 1 to expand")
    return tensor.narrow(dim, 0, 1).expand(tensor.shape)


def _overlapping_view(tensor: torch.Tensor, shape) -> torch.Tensor:
    """A view of ``shape`` over ``tensor``'s first element, with ``tensor``'s strides (same storage)."""
    strides = tensor.stride()[-len(shape):]
    try:
        return torch.as_strided(tensor, shape, strides, tensor.storage_offset())
    except RuntimeError as error:  # would reach past the storage
        raise NotApplicable(f"no overlapping view of shape {tuple(shape)}: {error}") from None


def _fp8_with_scale(built, cache_names, scale_name: str, bad: float, per_head: bool = False) -> Corrupted:
    """The case with fresh uint8 fp8 caches and a ``scale_name`` holding ``bad`` (one element, or the last
    of a per-head scale): a value error only the value checks can see."""
    heads = built.args["key"].size(1) if per_head else 1
    scale = torch.ones(heads, device=built.device)
    scale[-1] = bad
    caches = {name: _fresh(tuple(built.args[name].shape), torch.uint8, built.device) for name in cache_names}
    names = SCALE if scale_name == "scale" else (scale_name,)
    return _replace(built, names, True, kv_cache_dtype="fp8", **caches, **{scale_name: scale})


def _auto_caches_with_reader_inside(built, caches, cache: str, reader: str) -> Corrupted:
    """Fresh ``auto`` caches of the source dtype, and ``reader`` (a read-only argument) replaced by a view
    into the memory of ``cache``: a read that the write changes underneath."""
    source = built.args[reader]
    fresh = {name: _fresh(tuple(built.args[name].shape), source.dtype, built.device) for name in caches}
    entries = fresh[cache].view(-1, *fresh[cache].shape[2:])  # every slot, in order
    inside = entries[:source.size(0)][(..., *(slice(0, size) for size in source.shape[1:]))]
    return _replace(built, (reader, cache), kv_cache_dtype="auto", **fresh, **{reader: inside})


def _retyped(tensor: torch.Tensor) -> torch.dtype:
    """A float dtype different from ``tensor``'s."""
    return torch.float16 if tensor.dtype != torch.float16 else torch.bfloat16


def _positions_with(built, index: int, value: int) -> torch.Tensor:
    positions = built.args["positions"].clone()
    positions[index] = value
    return positions


def _slots_with(built, **assignments) -> torch.Tensor:
    slots = built.args["slot_mapping"].clone()
    for index, value in assignments.items():
        slots[int(index[1:])] = value
    return slots


def _num_slots(built, cache: str) -> int:
    return built.args[cache].size(0) * built.args[cache].size(1)


def _first_valid_slot(built) -> int:
    slots = built.args["slot_mapping"].cpu()
    valid = slots[slots >= 0]
    return int(valid[0]) if valid.numel() else 0


# ---------------------------------------------------------------- shared by several operations


def positions_corruptions() -> dict[str, Callable]:
    return {
        "positions_rank_2": lambda b: _replace(b, ("positions",), positions=b.args["positions"].reshape(1, -1)),
        "positions_too_short": lambda b: _replace(b, ("positions",), positions=b.args["positions"][:-1]),
        "positions_float": lambda b: _replace(b, ("positions",), positions=b.args["positions"].float()),
        "position_past_table": lambda b: _replace(
            b, ("positions",), True, positions=_positions_with(b, -1, b.args["cos_sin_cache"].size(0))),
        "position_negative": lambda b: _replace(b, ("positions",), True, positions=_positions_with(b, 0, -1)),
        "table_float64": lambda b: _replace(b, ("cos_sin_cache",), cos_sin_cache=b.args["cos_sin_cache"].double()),
        "table_rank_3": lambda b: _replace(b, ("cos_sin_cache",), cos_sin_cache=b.args["cos_sin_cache"][None]),
        "is_neox_not_bool": lambda b: _not_for_direct_calls(_replace(b, ("is_neox",), is_neox=int(b.args["is_neox"]))),
        "table_no_rows": lambda b: _replace(b, ("cos_sin_cache",), cos_sin_cache=b.args["cos_sin_cache"][:0]),
        "table_on_other_device": lambda b: _replace(
            b, ("cos_sin_cache", "positions"),
            cos_sin_cache=b.args["cos_sin_cache"].to(_other_device(b.device))),
    }


def slot_corruptions(cache: str) -> dict[str, Callable]:
    return {
        "slot_mapping_float": lambda b: _replace(b, ("slot_mapping",), slot_mapping=b.args["slot_mapping"].float()),
        "slot_mapping_longer_than_tokens": lambda b: _replace(
            b, ("slot_mapping",), slot_mapping=torch.cat([b.args["slot_mapping"], b.args["slot_mapping"][:1]])),
        "slot_mapping_rank_2": lambda b: _replace(b, ("slot_mapping",), slot_mapping=b.args["slot_mapping"][None]),
        "slot_past_cache": lambda b: _replace(b, ("slot_mapping",), True,
                                              slot_mapping=_slots_with(b, i0=_num_slots(b, cache))),
        "duplicate_valid_slots": lambda b: _replace(
            b, ("slot_mapping",), True,
            slot_mapping=_slots_with(b, i0=_first_valid_slot(b), i1=_first_valid_slot(b))),
        "unknown_kv_cache_dtype": lambda b: _replace(b, ("kv_cache_dtype",), kv_cache_dtype="fp8_e3m4"),
    }


def _wrong_cache_dtype(built, cache: str):
    """A cache whose dtype does not store this kv_cache_dtype (fp8 in fp16; source bits in another dtype)."""
    tensor = built.args[cache]
    dtype = torch.float16 if tensor.element_size() == 1 else (
        torch.uint8 if built.args["kv_cache_dtype"] in ("auto",) else _retyped(tensor))
    return _replace(built, (cache, "kv_cache_dtype"), **{cache: _fresh(tuple(tensor.shape), dtype, built.device)})


# ---------------------------------------------------------------- per operation


def rotary_embedding_corruptions() -> dict[str, Callable]:
    def head_size_not_dividing(b):
        return _replace(b, ("query", "head_size"), head_size=b.args["query"].size(-1) + 1)

    def table_wider_than_head(b):
        width = b.args["head_size"] + 2 - b.args["head_size"] % 2
        return _replace(b, ("cos_sin_cache",), cos_sin_cache=_fresh((b.args["cos_sin_cache"].size(0), width),
                                                                    b.args["cos_sin_cache"].dtype, b.device))

    def odd_rotary_width(b):
        table = b.args["cos_sin_cache"]
        return _replace(b, ("cos_sin_cache",), cos_sin_cache=_fresh((table.size(0), table.size(1) - 1), table.dtype,
                                                                    b.device))

    def key_overlaps_query(b):
        query, head_size = b.args["query"], b.args["head_size"]
        key = query[:, :1] if query.dim() == 3 else query[:, :head_size]  # the first query head
        return _replace(b, ("key", "query"), key=key)

    return {
        **positions_corruptions(),
        "query_rank_too_high": lambda b: _replace(b, ("query",), query=b.args["query"][None, None]),
        "query_int": lambda b: _replace(b, ("query",),
                                        query=_fresh(tuple(b.args["query"].shape), torch.int32, b.device)),
        "query_inner_stride_2": lambda b: _replace(
            b, ("query",), query=_fresh(tuple(b.args["query"].shape), b.args["query"].dtype, b.device, 2)),
        "key_other_dtype": lambda b: _replace(
            b, ("key", "query"), key=_fresh(tuple(b.args["query"].shape), _retyped(b.args["query"]), b.device)),
        "key_fewer_tokens": lambda b: _replace(b, ("key", "query"), key=b.args["query"][:-1]),
        "head_size_not_dividing": head_size_not_dividing,
        "table_wider_than_head": table_wider_than_head,
        "odd_rotary_width": odd_rotary_width,
        # zero sizes and integer types
        "head_size_zero": lambda b: _replace(b, ("head_size",), head_size=0),
        "head_size_float": lambda b: _not_for_direct_calls(_replace(b, ("head_size",),
                                                                    head_size=float(b.args["head_size"]))),
        "query_no_heads": lambda b: _replace(b, ("query",), query=b.args["query"][:, :0]),
        # aliasing: the key rotated twice, or a query element mapped to by several indices
        "key_is_query": lambda b: _replace(b, ("key", "query"), key=b.args["query"]),
        "key_overlaps_query": key_overlaps_query,
        "query_expanded": lambda b: _replace(b, ("query",), query=_expanded(b.args["query"])),
    }


SCALE = ("scale", "kv_cache_scale")  # the fused MLA op names its scale kv_cache_scale


def concat_and_cache_mla_corruptions() -> dict[str, Callable]:
    def cache_width(b, delta):
        cache = b.args["kv_cache"]
        return _replace(b, ("kv_cache",), kv_cache=_fresh((cache.size(0), cache.size(1), cache.size(2) + delta),
                                                          cache.dtype, b.device))

    return {
        **slot_corruptions("kv_cache"),
        "kv_c_rank_3": lambda b: _replace(b, ("kv_c",), kv_c=b.args["kv_c"][:, None, :]),
        "k_pe_fewer_tokens": lambda b: _replace(b, ("k_pe", "kv_c"), k_pe=b.args["k_pe"][:-1]),
        "k_pe_other_dtype": lambda b: _replace(
            b, ("k_pe", "kv_c"), k_pe=_fresh(tuple(b.args["k_pe"].shape), _retyped(b.args["k_pe"]), b.device)),
        "kv_c_inner_stride_2": lambda b: _replace(
            b, ("kv_c",), kv_c=_fresh(tuple(b.args["kv_c"].shape), b.args["kv_c"].dtype, b.device, 2)),
        "cache_entry_too_wide": lambda b: cache_width(b, 1),
        "cache_entry_too_narrow": lambda b: cache_width(b, -1),
        "cache_rank_4": lambda b: _replace(b, ("kv_cache",), kv_cache=b.args["kv_cache"][None]),
        "cache_dtype_mismatch": lambda b: _wrong_cache_dtype(b, "kv_cache"),
        "scale_two_elements": lambda b: _replace(b, SCALE, scale=b.args["scale"].repeat(2)),
        "scale_float64": lambda b: _replace(b, SCALE, scale=b.args["scale"].double()),
        "scale_on_other_device": lambda b: _replace(b, SCALE + ("kv_c",),
                                                    scale=b.args["scale"].to(_other_device(b.device))),
        # zero sizes
        "cache_no_blocks": lambda b: _replace(b, ("kv_cache",), kv_cache=b.args["kv_cache"][:0]),
        "cache_blocks_of_no_entries": lambda b: _replace(b, ("kv_cache",), kv_cache=b.args["kv_cache"][:, :0]),
        "kv_c_no_latent": lambda b: _replace(b, ("kv_c",), kv_c=b.args["kv_c"][:, :0],
                                             kv_cache=b.args["kv_cache"][..., b.args["kv_c"].size(1):]),
        # aliasing
        "cache_expanded": lambda b: _replace(b, ("kv_cache",), kv_cache=_expanded(b.args["kv_cache"])),
        "kv_c_inside_cache": lambda b: _auto_caches_with_reader_inside(b, ("kv_cache",), "kv_cache", "kv_c"),
        # fp8 scale values (value checks)
        "scale_zero": lambda b: _fp8_with_scale(b, ("kv_cache",), "scale", 0.0),
        "scale_negative": lambda b: _fp8_with_scale(b, ("kv_cache",), "scale", -0.5),
        "scale_nan": lambda b: _fp8_with_scale(b, ("kv_cache",), "scale", float("nan")),
        "scale_inf": lambda b: _fp8_with_scale(b, ("kv_cache",), "scale", float("inf")),
    }


def concat_and_cache_mla_rope_fused_corruptions() -> dict[str, Callable]:
    def table_width(b, width):
        table = b.args["cos_sin_cache"]
        return _replace(b, ("cos_sin_cache",), cos_sin_cache=_fresh((table.size(0), width), table.dtype, b.device))

    return {
        **concat_and_cache_mla_corruptions(),
        **positions_corruptions(),
        "q_pe_rank_2": lambda b: _replace(b, ("q_pe",), q_pe=b.args["q_pe"][:, 0]),
        "q_pe_wider_than_k_pe": lambda b: _replace(
            b, ("q_pe", "k_pe"), q_pe=_fresh((*b.args["q_pe"].shape[:2], b.args["q_pe"].size(2) + 2),
                                             b.args["q_pe"].dtype, b.device)),
        "q_pe_fewer_tokens": lambda b: _replace(b, ("q_pe", "kv_c"), q_pe=b.args["q_pe"][:-1]),
        "q_pe_inner_stride_2": lambda b: _replace(
            b, ("q_pe",), q_pe=_fresh(tuple(b.args["q_pe"].shape), b.args["q_pe"].dtype, b.device, 2)),
        "table_wider_than_rotary": lambda b: table_width(b, b.args["k_pe"].size(1) + 2),
        "table_odd_width": lambda b: table_width(b, b.args["k_pe"].size(1) - 1),
        "q_pe_no_heads": lambda b: _replace(b, ("q_pe",), q_pe=b.args["q_pe"][:, :0]),
        "k_pe_overlaps_q_pe": lambda b: _replace(b, ("k_pe", "q_pe"), k_pe=b.args["q_pe"][:, 0, :]),
        "q_pe_expanded": lambda b: _replace(b, ("q_pe",), q_pe=_expanded(b.args["q_pe"])),
    }


def reshape_and_cache_flash_corruptions() -> dict[str, Callable]:
    def shaped(b, name, dim, delta, names=None, dtype=None, inner_stride=1):
        shape = list(b.args[name].shape)
        shape[dim] += delta
        tensor = _fresh(tuple(shape), dtype or b.args[name].dtype, b.device, inner_stride)
        return _replace(b, names or (name,), **{name: tensor})

    def no_kv_heads(b):
        heads = {name: b.args[name][:, :0] for name in ("key", "value")}
        heads.update({name: b.args[name][:, :, :0] for name in ("key_cache", "value_cache")})
        if "query" in b.args:
            heads["query"] = b.args["query"][:, :0]
        return _replace(b, ("key", "query"), **heads)

    return {
        **slot_corruptions("key_cache"),
        "key_rank_2": lambda b: _replace(b, ("key",), key=b.args["key"].flatten(1)),
        "value_more_heads": lambda b: shaped(b, "value", 1, 1, ("value", "key")),
        "value_fewer_tokens": lambda b: shaped(b, "value", 0, -1, ("value", "key")),
        "value_other_dtype": lambda b: shaped(b, "value", 0, 0, ("value", "key"), dtype=_retyped(b.args["value"])),
        "value_inner_stride_2": lambda b: shaped(b, "value", 0, 0, inner_stride=2),
        "key_cache_more_heads": lambda b: shaped(b, "key_cache", 2, 1),
        "key_cache_wider_heads": lambda b: shaped(b, "key_cache", 3, 1),
        "value_cache_more_blocks": lambda b: shaped(b, "value_cache", 0, 1, ("value_cache", "key_cache")),
        "cache_dtype_mismatch": lambda b: _wrong_cache_dtype(b, "value_cache"),
        "k_scale_wrong_length": lambda b: _replace(
            b, ("k_scale",), k_scale=torch.ones(b.args["key"].size(1) + 1, device=b.device)),
        "v_scale_float64": lambda b: _replace(b, ("v_scale",), v_scale=b.args["v_scale"].double()),
        "v_scale_on_other_device": lambda b: _replace(b, ("v_scale", "key"),
                                                      v_scale=b.args["v_scale"].to(_other_device(b.device))),
        # zero sizes
        "caches_no_blocks": lambda b: _replace(b, ("key_cache", "value_cache"), key_cache=b.args["key_cache"][:0],
                                               value_cache=b.args["value_cache"][:0]),
        "no_kv_heads": no_kv_heads,
        "value_no_head_size": lambda b: _replace(b, ("value",), value=b.args["value"][..., :0],
                                                 value_cache=b.args["value_cache"][..., :0]),
        # aliasing
        "value_cache_over_key_cache": lambda b: _replace(
            b, ("value_cache", "key_cache"),
            value_cache=_overlapping_view(b.args["key_cache"], tuple(b.args["value_cache"].shape))),
        "key_cache_expanded": lambda b: _replace(b, ("key_cache",), key_cache=_expanded(b.args["key_cache"])),
        "value_inside_value_cache": lambda b: _auto_caches_with_reader_inside(b, ("key_cache", "value_cache"),
                                                                              "value_cache", "value"),
        # fp8 scale values (value checks)
        "k_scale_zero": lambda b: _fp8_with_scale(b, ("key_cache", "value_cache"), "k_scale", 0.0),
        "v_scale_nan": lambda b: _fp8_with_scale(b, ("key_cache", "value_cache"), "v_scale", float("nan")),
        "k_scale_inf": lambda b: _fp8_with_scale(b, ("key_cache", "value_cache"), "k_scale", float("inf")),
        "v_scale_per_head_negative": lambda b: _fp8_with_scale(b, ("key_cache", "value_cache"), "v_scale", -1.0,
                                                               per_head=True),
    }


def rope_and_reshape_and_cache_flash_corruptions() -> dict[str, Callable]:
    def query(b, dim, delta, dtype=None):
        shape = list(b.args["query"].shape)
        shape[dim] += delta
        return _replace(b, ("query", "key"), query=_fresh(tuple(shape), dtype or b.args["query"].dtype, b.device))

    def table_wider_than_head(b):
        width = b.args["key"].size(2) + 2 - b.args["key"].size(2) % 2
        table = b.args["cos_sin_cache"]
        return _replace(b, ("cos_sin_cache",), cos_sin_cache=_fresh((table.size(0), width), table.dtype, b.device))

    return {
        **reshape_and_cache_flash_corruptions(),
        **positions_corruptions(),
        "query_rank_2": lambda b: _replace(b, ("query",), query=b.args["query"].flatten(1)),
        "query_other_head_size": lambda b: query(b, 2, 1),
        "query_fewer_tokens": lambda b: query(b, 0, -1),
        "query_other_dtype": lambda b: query(b, 0, 0, _retyped(b.args["query"])),
        "table_wider_than_head": table_wider_than_head,
        "key_overlaps_query": lambda b: _replace(b, ("key", "query"), key=b.args["query"][:, :b.args["key"].size(1)]),
        "query_expanded": lambda b: _replace(b, ("query",), query=_expanded(b.args["query"])),
    }


# operation -> corruption name -> function; each operation's table is ``<operation>_corruptions()``
# The named bad inputs of each operation (tests/test_suite_checks.py: exactly the OPERATIONS).
CORRUPTIONS: dict[str, dict[str, Callable]] = {
    "rotary_embedding": rotary_embedding_corruptions(),
    "concat_and_cache_mla": concat_and_cache_mla_corruptions(),
    "concat_and_cache_mla_rope_fused": concat_and_cache_mla_rope_fused_corruptions(),
    "reshape_and_cache_flash": reshape_and_cache_flash_corruptions(),
    "rope_and_reshape_and_cache_flash": rope_and_reshape_and_cache_flash_corruptions(),
}


def names(operation: str) -> list[str]:
    """The corruptions of ``operation``, in the order its bad-input property is parametrized."""
    return sorted(CORRUPTIONS[operation])


def corrupt(operation: str, corruption: str, built) -> Corrupted:
    return CORRUPTIONS[operation][corruption](built)
