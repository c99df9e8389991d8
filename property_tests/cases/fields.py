"""A case's generated fields, one at a time: enumerate them, vary one, and the relations between them.

The conformance map (``commands/conformance_map/property_map.py``) diagnoses a failing case by moving it along
its own fields rather than along a fixed list of feature axes: every size, the block size, each
buffer's memory order, padding, offset and storage offset, the index dtypes and layouts, the value
ranges. A field is named by its path in the case: ``block_size``, ``slots.padding``,
``cache_place.order``, ``cache_place.pad[1]`` (one element of a tuple), ``values.nan_count``.

* ``leaves(case, rotates)``: ``{path: value}`` of the fields that can matter to the operation;
* ``alternatives(case, path)``: the other values of one field worth trying (a small set: the
  strategy's domain where it is small, else values around the current one: neighbours, powers of
  two and not);
* ``vary(case, path, value)``: the case with that one field changed, and only the fields that
  must follow it to stay a valid case (more tokens need room in the cache; ``slot_mapping`` as
  long as the tokens stays as long); None where no valid case has that value;
* ``relations(built)``: derived facts computed from the built tensors, each ``name: yes/no``
  ("kv_cache block stride == block_size x entry stride", "block_size power of two",
  "slot_mapping length == tokens"...), so that a trigger that is a relation between fields (a
  stride against a size times another stride) can be named as such.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from typing import Protocol

from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase
from mla_fuse_conformance.cases.value_relations import value_relations
from mla_fuse_conformance.declarations.layout_types import KV_FORMS

ELEMENT = re.compile(r"^(.*)\[(\d+)\]$")  # ``name[i]``: one element of a tuple field


class OtherFields(Protocol):
    """The fields of another kind of case (the compile-pass ``CompileCase``: ``compile_passes/axes.py``),
    registered in ``OTHER_KINDS``: ``leaves``, ``alternatives`` and ``vary`` as below for that kind."""

    def leaves(self, case) -> dict[str, object]: ...
    def alternatives(self, case, path: str) -> tuple: ...
    def vary(self, case, path: str, value): ...


OTHER_KINDS: dict[type, OtherFields] = {}

# fields no operation reads, or that only pick data (the seed is varied by the map on its own)
SKIPPED = {"seed", "check_values", "slots.pad_fraction", "values.log2_spread", "value_values.log2_spread",
           "values.sign", "value_values.sign",
           "table.yarn_mscale", "table.yarn_mscale_all_dim", "table.yarn_attn_factor", "table.base",
           "table.poison_unused_rows"}
# fields only the rotating operations read (the unfused cache writes ignore them)
ROPE_ONLY_PREFIXES = ("table.", "positions.", "is_neox", "q_place.", "query_place.")

STRINGS = {
    "dtype": ("float32", "bfloat16", "float16"),
    "kv_cache_dtype": ("auto", "float32", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"),
    "cache_storage": ("source", "uint8", "float8"),
    "slots.padding": ("none", "some", "all"),
    "slots.placement": ("random", "prefill", "extremes", "per_block", "mid_block"),
    "kv_form": tuple(KV_FORMS),
    "slots.dtype": ("int64", "int32"),
    "positions.dtype": ("int64", "int32"),
    "positions.pattern": ("uniform", "prefill", "last_rows", "zeros"),
    "table.dtype": ("float32", "input"),
    "table.style": ("plain", "deepseek_yarn"),
}
INTS = {
    "tokens": (0, 1, 2, 3, 4, 5, 8, 17),
    "block_size": (1, 2, 3, 4, 5, 6, 8, 12, 16, 32),
    "latent": (1, 2, 3, 4, 8, 15, 16, 24, 32, 40, 64),
    "rotary_dim": (2, 4, 6, 8, 16, 32),
    "heads": (1, 2, 3, 4),
    "kv_heads": (0, 1, 2, 3),
    "head_size": (),  # around rotary_dim (alternatives)
    "value_head_size": (),
    "slots.stride": (1, 2, 3),
    "slots.pad_value": (-1, -2),
    "positions.stride": (1, 2, 3),
    "values.nan_count": (0, 1, 2),
    "value_values.nan_count": (0, 1, 2),
    "table.max_position": (),
}
# small integer domains tried whole (no neighbours: a pad value of 1 is a valid slot, not a pad)
DOMAINS = {"slots.stride": (1, 2, 3), "slots.pad_value": (-1, -2), "positions.stride": (1, 2, 3),
           "values.nan_count": (0, 1, 2), "value_values.nan_count": (0, 1, 2)}
FLOATS = {
    "values.log2_magnitude": (0.0, -8.0, 8.0),
    "value_values.log2_magnitude": (0.0, -8.0, 8.0),
    "values.midpoint_fraction": (0.0, 0.5),
    "value_values.midpoint_fraction": (0.0, 0.5),
    "scale.log2": (0.0, 1.0, -3.0),
    "k_scale.log2": (0.0, 1.0, -3.0),
    "v_scale.log2": (0.0, 1.0, -3.0),
    "scale.mantissa": (1.0, 1.5),
    "k_scale.mantissa": (1.0, 1.5),
    "v_scale.mantissa": (1.0, 1.5),
}
PLACEMENT_ALTERNATIVES = {"pad": (0, 1, 3), "lead": (0, 3), "trail": (0, 2)}


# ---------------------------------------------------------------- placements and their ranks


def placement_ranks(case) -> dict[str, int]:
    """The rank of the tensor each ``Placement`` field of ``case`` places (``cache_order`` places
    the flash caches, so their ``cache_place.order`` is not a field)."""
    if isinstance(case, MlaCase):
        return {"q_place": 3, "kv_c_place": 2, "k_pe_place": 2, "cache_place": 3}
    if isinstance(case, FlashCase):
        return {"query_place": 2 if case.qkv_packed else 3, "key_place": 3, "value_place": 3, "cache_place": 4}
    if isinstance(case, RopeCase):
        rank = 2 if case.qkv_packed else case.rank
        return {"query_place": rank, "key_place": rank}
    return {}


def _full(place: Placement, rank: int) -> Placement:
    """``place`` with every tuple as long as the rank (a plain placement's empty tuples filled)."""
    return dataclasses.replace(place, pad=tuple(place.pad) + (0,) * (rank - len(place.pad)),
                               offset=tuple(place.offset) + (0,) * (rank - len(place.offset)),
                               order=tuple(place.order) if len(place.order) == rank else tuple(range(rank)))


def _placement_leaves(name: str, place: Placement, rank: int, with_order: bool) -> dict[str, object]:
    full = _full(place, rank)
    out = {f"{name}.pad[{d}]": full.pad[d] for d in range(rank)}
    out.update({f"{name}.offset[{d}]": full.offset[d] for d in range(rank) if full.pad[d]})
    if with_order and rank > 2:
        out[f"{name}.order"] = full.order
    out[f"{name}.lead"], out[f"{name}.trail"] = full.lead, full.trail
    return out


# ---------------------------------------------------------------- enumerate


def leaves(case, rotates: bool = True) -> dict[str, object]:
    """``{path: value}`` of the fields of ``case`` worth varying (module docstring)."""
    if type(case) in OTHER_KINDS:
        return OTHER_KINDS[type(case)].leaves(case)
    ranks = placement_ranks(case)
    out: dict[str, object] = {}
    for field in dataclasses.fields(case):
        name, value = field.name, getattr(case, field.name)
        if isinstance(value, Placement):
            with_order = not (isinstance(case, FlashCase) and name == "cache_place")
            out.update(_placement_leaves(name, value, ranks.get(name, len(value.pad) or 2), with_order))
        elif dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                out[f"{name}.{inner.name}"] = getattr(value, inner.name)
        else:
            out[name] = value
    if isinstance(case, MlaCase):
        out.pop("table.rotary_dim", None)  # follows rotary_dim
        if case.kv_packed:  # k_pe sits in kv_c's packed buffer: its own placement is unused
            out = {path: value for path, value in out.items() if not path.startswith("k_pe_place.")}
    if isinstance(case, MlaCase) and not rotates:
        out.pop("heads", None)
    if not rotates:
        out = {path: value for path, value in out.items() if not path.startswith(ROPE_ONLY_PREFIXES)}
    return {path: value for path, value in out.items() if path not in SKIPPED}


def get(case, path: str):
    return leaves(case)[path] if path not in SKIPPED else None


# ---------------------------------------------------------------- alternatives


def _around(value: int, low: int = 1) -> tuple[int, ...]:
    near = {value - 1, value + 1, 2 * value, value // 2, 1 << max(value - 1, 0).bit_length(), 3 * value // 2}
    return tuple(sorted(v for v in near if v >= low))


def alternatives(case, path: str) -> tuple:
    """Values of field ``path`` to try other than its own (module docstring)."""
    if type(case) in OTHER_KINDS:
        return OTHER_KINDS[type(case)].alternatives(case, path)
    current = leaves(case).get(path)
    if path in STRINGS:
        values = STRINGS[path]
    elif isinstance(current, bool):
        values = (False, True)
    elif path in FLOATS:
        values = FLOATS[path]
    elif path.endswith(".order"):
        rank = len(current)
        values = tuple(tuple(p) + (rank - 1,) for p in itertools.permutations(range(rank - 1)))
    elif ".pad[" in path or path.endswith((".lead", ".trail")):
        values = PLACEMENT_ALTERNATIVES["pad" if ".pad[" in path else path.rpartition(".")[2]]
    elif ".offset[" in path:
        prefix, _, index = path.rpartition(".offset")
        pad = leaves(case).get(f"{prefix}.pad{index}", 0)
        values = tuple(sorted({0, pad}))
    elif path == "num_blocks":
        least = math.ceil((case.tokens + 1) / case.block_size)
        values = (least, least + 1, least + 3)
    elif path == "slots.length":
        values = tuple(sorted({0, max(case.tokens - 1, 0), case.tokens}))
    elif path in ("head_size", "value_head_size"):
        rotary = case.table.rotary_dim
        values = tuple(sorted({rotary, rotary + 1, rotary + 2, 2 * rotary, current}))
    elif path == "table.max_position":
        values = tuple(sorted({1, 8, 64, current}))
    elif path in DOMAINS:
        values = DOMAINS[path]
    elif path in INTS and INTS[path]:
        values = tuple(sorted(set(INTS[path]) | set(_around(current, 0 if path == "tokens" else 1))))
        if path not in ("tokens",):
            values = tuple(v for v in values if v >= min(INTS[path]))
    elif isinstance(current, int):
        values = _around(current, 0)
    else:
        return ()
    return tuple(v for v in values if v != current)


# ---------------------------------------------------------------- vary


def _set_path(case, path: str, value):
    match = ELEMENT.match(path)
    head, _, rest = (match.group(1) if match else path).partition(".")
    if not rest:
        return dataclasses.replace(case, **{head: value})
    inner = getattr(case, head)
    if isinstance(inner, Placement):
        inner = _full(inner, placement_ranks(case).get(head, len(inner.pad) or 2))
    if match:
        items = list(getattr(inner, rest))
        items[int(match.group(2))] = value
        value = tuple(items)
    return dataclasses.replace(case, **{head: dataclasses.replace(inner, **{rest: value})})


def _fix(case, before, path: str):
    """The fields that follow a changed one, so the case stays valid."""
    if path.endswith("]") and ".pad[" in path:  # an offset stays inside its padding
        prefix, index = path.split(".pad")
        place = getattr(case, prefix)
        d = int(index.strip("[]"))
        if place.offset[d] > place.pad[d]:
            offset = list(place.offset)
            offset[d] = place.pad[d]
            case = dataclasses.replace(case, **{prefix: dataclasses.replace(place, offset=tuple(offset))})
    if isinstance(case, RopeCase):
        return case
    if path == "tokens":
        length = case.tokens if before.slots.length == before.tokens else min(before.slots.length, case.tokens)
        case = dataclasses.replace(case, slots=dataclasses.replace(case.slots, length=length))
    if path in ("tokens", "block_size"):
        spare = before.num_blocks - math.ceil((before.tokens + 1) / before.block_size)
        least = math.ceil((case.tokens + 1) / case.block_size)
        case = dataclasses.replace(case, num_blocks=least + max(spare, 0))
    if isinstance(case, MlaCase) and path == "rotary_dim":
        case = dataclasses.replace(case, table=dataclasses.replace(case.table, rotary_dim=case.rotary_dim))
    if path in ("dtype",) and before.kv_cache_dtype == before.dtype:
        case = dataclasses.replace(case, kv_cache_dtype=case.dtype)
    if path == "kv_cache_dtype":
        fp8 = case.kv_cache_dtype.startswith("fp8")
        storage = (before.cache_storage if before.cache_storage != "source" else "uint8") if fp8 else "source"
        case = dataclasses.replace(case, cache_storage=storage)
    if isinstance(case, FlashCase) and path in ("heads", "kv_heads"):
        if case.kv_heads < 1 or case.heads % case.kv_heads:
            return None
    if isinstance(case, FlashCase) and case.kv_form != "split" and case.value_head_size != case.head_size:
        return None
    return case


def valid(case) -> bool:
    """Whether ``case`` is one the strategies could draw (the checks the builders do not make)."""
    if isinstance(case, RopeCase):
        return case.tokens >= 0 and case.heads >= 1 and case.head_size >= case.table.rotary_dim and (
            case.table.rotary_dim % 2 == 0)
    if case.slots.length > case.tokens or case.block_size < 1 or case.num_blocks * case.block_size <= case.tokens:
        return False
    if case.kv_cache_dtype in ("float32", "bfloat16", "float16") and case.kv_cache_dtype != case.dtype:
        return False
    fp8 = case.kv_cache_dtype.startswith("fp8")
    if fp8 != (case.cache_storage != "source"):
        return False
    if isinstance(case, MlaCase):
        return case.rotary_dim % 2 == 0 and case.latent >= 1 and case.table.rotary_dim == case.rotary_dim
    one_pool = case.kv_form != "split"  # K and V views of one pool, each D wide (tensors._flash_caches)
    return (case.head_size >= case.table.rotary_dim and case.table.rotary_dim % 2 == 0 and case.kv_heads >= 1
            and case.heads % case.kv_heads == 0 and not (one_pool and case.value_head_size != case.head_size))


def vary(case, path: str, value):
    """``case`` with field ``path`` set to ``value`` (and what must follow it), or None."""
    if type(case) in OTHER_KINDS:
        return OTHER_KINDS[type(case)].vary(case, path, value)
    try:
        moved = _fix(_set_path(case, path, value), case, path)
    except (TypeError, ValueError, IndexError, AttributeError):
        return None
    if moved is None or not valid(moved) or leaves(moved).get(path, value) != value:
        return None
    return moved


def show(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return str(value)


# ---------------------------------------------------------------- relations from the built tensors


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def relations(built) -> dict[str, bool]:
    """Derived yes/no facts of a built case (``cases.tensors.Built``): how each buffer's strides
    relate to its sizes, the size relations a kernel may assume, and what the written values are
    against their formats (``value_relations``)."""
    case, args = built.case, built.args
    out: dict[str, bool] = {}
    for name in ("kv_cache", "key_cache", "value_cache"):
        cache = args.get(name)
        if cache is None or cache.dim() < 3:
            continue
        entry = cache.stride(2) * cache.size(2) if cache.dim() == 4 else 0
        # with one block the block stride is never used: its blocks are runs of entries whatever it is
        out[f"{name} block stride == block_size x entry stride"] = (
            cache.size(0) <= 1 or cache.stride(0) == cache.size(1) * cache.stride(1))
        if cache.dim() == 3:
            out[f"{name} entry stride == entry width"] = cache.stride(1) == cache.size(2)
        else:
            out[f"{name} entry stride == heads x head stride"] = cache.stride(1) == entry
        out[f"{name} contiguous"] = cache.is_contiguous()
        out[f"{name} at the start of its allocation"] = cache.storage_offset() == 0
    for name in ("query", "key", "value", "q_pe", "kv_c", "k_pe", "positions", "slot_mapping"):
        tensor = args.get(name)
        if tensor is not None and hasattr(tensor, "is_contiguous"):
            out[f"{name} contiguous"] = tensor.is_contiguous()
    slots = args.get("slot_mapping")
    if slots is not None:
        out["slot_mapping length == tokens"] = slots.numel() == case.tokens
        out["some slot written (slot >= 0)"] = bool((slots >= 0).any()) if slots.numel() else False
        out["a padded entry (slot < 0)"] = bool((slots < 0).any()) if slots.numel() else False
        pad = case.slots.pad_value
        out["slot 0 given to a token"] = bool(((slots == 0) & (slots != pad)).any()) if slots.numel() else False
        block_size = getattr(case, "block_size", 0)
        out["a slot past the first block written"] = bool((slots >= block_size).any()) if slots.numel() else False
    out["tokens > 0"] = case.tokens > 0
    if getattr(case, "heads", 0):
        out["heads > 1"] = case.heads > 1
    for size in ("block_size", "latent", "rotary_dim", "head_size", "value_head_size", "tokens", "heads"):
        value = getattr(case, size, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out[f"{size} power of two"] = _power_of_two(value)
    if isinstance(case, MlaCase):
        out["latent + rotary_dim power of two"] = _power_of_two(case.latent + case.rotary_dim)
    if isinstance(case, (MlaCase, FlashCase)):
        out["fp8 cache"] = case.kv_cache_dtype.startswith("fp8")
    values = getattr(case, "values", None)
    if values is not None:
        out["NaN in the inputs"] = bool(values.nan_count) or bool(getattr(getattr(case, "value_values", None),
                                                                          "nan_count", 0))
    out.update(value_relations(built))  # what the written values are, against their formats
    return out
