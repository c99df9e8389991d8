"""The argument rules the operations' checkers are made of (CONTRACT §4, "Bad input"; the rules:
docs/INPUTS.md): one function per rule or per kind of argument, each raising ``ValueError`` or
``TypeError`` whose message names the operation and the argument and says what was expected and
what came.

Sync-free checks read only metadata (ranks, sizes, dtypes, strides, devices, and the addresses
that tell whether a written buffer overlaps another argument). The value checks
(``check_index_values``) read tensor values with one device sync. ``mla_fuse.validation`` composes
them into one checker per operation.
"""

from __future__ import annotations

import collections
import operator
from typing import Collection, Sequence

import torch

from mla_fuse import overlap

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

# kv_cache_dtype -> (fp8 format or None, the float8 torch dtype or None, the named dtype or None)
_FP8_E4M3 = ("e4m3", torch.float8_e4m3fn, None)
_FP8_E5M2 = ("e5m2", torch.float8_e5m2, None)
KV_CACHE_DTYPES = {
    "auto": (None, None, None),
    "bfloat16": (None, None, torch.bfloat16),
    "float16": (None, None, torch.float16),
    "float32": (None, None, torch.float32),
    "fp8": _FP8_E4M3,
    "fp8_e4m3": _FP8_E4M3,
    "fp8_e5m2": _FP8_E5M2,
}


def fp8_format(kv_cache_dtype: str) -> str | None:
    """``"e4m3"``, ``"e5m2"`` or ``None`` (the cache stores the source bits)."""
    return KV_CACHE_DTYPES[kv_cache_dtype][0]


# ---------------------------------------------------------------- primitives


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
    return f"{type(value).__name__} {value!r}"


def _layout(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}"


def require_tensor(op: str, name: str, value, *, ndim: int | Sequence[int] | None = None,
                   dtypes: Sequence[torch.dtype] | None = None, inner_contiguous: bool = True) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a torch.Tensor, got {_describe(value)}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if value.dim() not in allowed:
            raise ValueError(
                f"{op}: argument '{name}' must have rank {' or '.join(map(str, allowed))}, "
                f"got shape {tuple(value.shape)}"
            )
    if dtypes is not None and value.dtype not in dtypes:
        raise TypeError(
            f"{op}: argument '{name}' must have dtype in {[str(d) for d in dtypes]}, got {value.dtype}"
        )
    if inner_contiguous and value.dim() > 0 and value.size(-1) > 1 and value.stride(-1) != 1:
        raise ValueError(
            f"{op}: argument '{name}' must have innermost stride 1, got strides {tuple(value.stride())}"
        )
    return value


def require_size(op: str, name: str, value: torch.Tensor, dim: int, expected: int, what: str) -> None:
    if value.size(dim) != expected:
        raise ValueError(
            f"{op}: argument '{name}' must have size {expected} ({what}) in dim {dim}, "
            f"got shape {tuple(value.shape)}"
        )


def require_nonempty(op: str, name: str, value: torch.Tensor, **what_of_dim: int) -> None:
    """Sizes that must be positive (every size but the token count): ``what=dim``."""
    if 0 not in value.shape:
        return
    for what, dim in what_of_dim.items():
        if value.size(dim) == 0:
            raise ValueError(
                f"{op}: argument '{name}' has no {what.replace('_', ' ')} (size 0 in dim {dim}, shape "
                f"{tuple(value.shape)}); every size but the token count must be positive"
            )


def require_same_dtype(op: str, reference_name: str, reference: torch.Tensor, **others: torch.Tensor) -> None:
    for name, tensor in others.items():
        if tensor.dtype != reference.dtype:
            raise TypeError(
                f"{op}: argument '{name}' must have the dtype of '{reference_name}' "
                f"({reference.dtype}), got {tensor.dtype}"
            )


def require_same_device(op: str, **tensors: torch.Tensor | None) -> None:
    present = [(name, t) for name, t in tensors.items() if t is not None]
    first_name, first = present[0]
    for name, tensor in present[1:]:
        if tensor.device != first.device:
            raise ValueError(
                f"{op}: argument '{name}' is on {tensor.device} but '{first_name}' is on {first.device}; "
                "all tensors must be on one device"
            )


def require_kernel_device(op: str, name: str, tensor: torch.Tensor) -> None:
    """The kernels of a process whose Triton backend is the GPU read CUDA memory only; a CPU tensor
    would reach Triton's launcher and fail there with no argument named (``kernels.BACKEND``)."""
    if not tensor.is_cpu:  # the hot path of a GPU process: no import, no device object
        return
    from mla_fuse import kernels  # chose its backend when first imported

    if kernels.BACKEND == "gpu":
        raise ValueError(
            f"{op}: argument '{name}' is on the CPU, but mla_fuse's kernels run on the GPU in this process "
            f"(Triton backend 'gpu'); pass CUDA tensors, or set ${kernels.BACKEND_ENV_VAR}=interpreter before "
            "mla_fuse is imported to run CPU tensors through Triton's interpreter"
        )


def require_same_tokens(op: str, **tokens: int) -> int:
    """The token count most arguments agree on (the first named wins a tie); the odd one is named."""
    first, *rest = tokens.values()
    if all(count == first for count in rest):
        return first
    counts = collections.Counter(tokens.values())
    agreed = counts.most_common(1)[0][0]
    odd = next(name for name, count in tokens.items() if count != agreed)
    others = " and ".join(f"'{name}'" for name, count in tokens.items() if count == agreed)
    raise ValueError(
        f"{op}: argument '{odd}' has {tokens[odd]} rows in dim 0 but {others} "
        f"{'has' if counts[agreed] == 1 else 'have'} {agreed}; dim 0 is the token dim of every per-token argument"
    )


def check_no_overlap(op: str, tensors: dict[str, torch.Tensor | None], written: Collection[str]) -> None:
    """No argument of ``written`` maps two indices to one element or shares memory with another of
    ``tensors`` (the written ones first, in order, then the read ones; ``None`` arguments are
    skipped). Decided from addresses, sizes and strides (``mla_fuse.overlap``); needs no device
    sync. Meta tensors have no memory and are never checked."""
    if next(iter(tensors.values())).is_meta:
        return
    try:
        found = overlap.first_overlap(tensors, written)
    except overlap.TooHard as error:
        raise ValueError(f"{op}: cannot tell whether the arguments {sorted(written)} overlap any other argument "
                         f"({error}); pass buffers in ordinary layouts") from None
    if found is None:
        return
    name, other = found
    tensor = tensors[name]
    if other is None:
        raise ValueError(
            f"{op}: argument '{name}' maps several indices to one element ({_layout(tensor)}: an expand()ed or "
            "stride-0 view?); a written argument needs its own element at every index"
        )
    raise ValueError(
        f"{op}: arguments '{name}' ({_layout(tensor)}) and '{other}' ({_layout(tensors[other])}) "
        "overlap in memory; an argument the operation writes must not share memory with any other"
    )


# ---------------------------------------------------------------- arguments of one kind


def check_head_size(op: str, head_size) -> int:
    """Any integer type (``int``, ``numpy.int64``), positive; returned as an ``int``."""
    if isinstance(head_size, bool) or not hasattr(head_size, "__index__"):
        raise TypeError(f"{op}: argument 'head_size' must be an integer, got {_describe(head_size)}")
    head_size = operator.index(head_size)
    if head_size <= 0:
        raise ValueError(f"{op}: argument 'head_size' must be positive, got {head_size}")
    return head_size


def check_positions(op: str, positions) -> None:
    require_tensor(op, "positions", positions, ndim=1, dtypes=INDEX_DTYPES, inner_contiguous=False)


def check_slot_mapping(op: str, slot_mapping, num_tokens: int) -> None:
    require_tensor(op, "slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, inner_contiguous=False)
    if slot_mapping.size(0) > num_tokens:
        raise ValueError(
            f"{op}: argument 'slot_mapping' has {slot_mapping.size(0)} entries but there are only "
            f"{num_tokens} tokens; it may be shorter (graph padding) but never longer"
        )


def check_cos_sin_cache(op: str, cos_sin_cache, query_dtype: torch.dtype, rotary_dim: int | None,
                        head_size: int) -> int:
    """Check the ``[P, R]`` table and return ``R``."""
    require_tensor(op, "cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES)
    if cos_sin_cache.dtype not in (torch.float32, query_dtype):
        raise TypeError(
            f"{op}: argument 'cos_sin_cache' must be float32 or the input dtype ({query_dtype}), "
            f"got {cos_sin_cache.dtype}"
        )
    require_nonempty(op, "cos_sin_cache", cos_sin_cache, rows=0)
    width = cos_sin_cache.size(1)
    if width % 2 != 0 or width == 0:
        raise ValueError(f"{op}: argument 'cos_sin_cache' must have an even, positive rotary width, got {width}")
    if rotary_dim is not None and width != rotary_dim:
        raise ValueError(
            f"{op}: argument 'cos_sin_cache' has width {width} but the rotary width is {rotary_dim}"
        )
    if width > head_size:
        raise ValueError(
            f"{op}: argument 'cos_sin_cache' has rotary width {width} larger than the head size {head_size}"
        )
    return width


def check_kv_cache_dtype(op: str, kv_cache_dtype) -> None:
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"{op}: argument 'kv_cache_dtype' must be one of {sorted(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
        )


def check_cache_tensor(op: str, name: str, cache, ndim: int, kv_cache_dtype: str,
                       source_dtype: torch.dtype) -> None:
    """The storage dtype for ``kv_cache_dtype``, and at least one slot (blocks and block size > 0)."""
    fp8, float8_dtype, named_dtype = KV_CACHE_DTYPES[kv_cache_dtype]
    require_tensor(op, name, cache, ndim=ndim)
    require_nonempty(op, name, cache, blocks=0, entries_per_block=1)
    if fp8 is not None:
        if cache.dtype not in (torch.uint8, float8_dtype):
            raise TypeError(
                f"{op}: argument '{name}' must be torch.uint8 or {float8_dtype} for "
                f"kv_cache_dtype={kv_cache_dtype!r}, got {cache.dtype}"
            )
        return
    if named_dtype is not None and source_dtype != named_dtype:
        raise TypeError(
            f"{op}: argument 'kv_cache_dtype' is {kv_cache_dtype!r}, which needs source tensors of {named_dtype}, "
            f"got {source_dtype}"
        )
    if cache.dtype != source_dtype:
        raise TypeError(
            f"{op}: argument '{name}' must have the source dtype {source_dtype} for "
            f"kv_cache_dtype={kv_cache_dtype!r} (the cache stores the source bits), got {cache.dtype}"
        )


def check_scale(op: str, name: str, scale, num_heads: int | None = None) -> None:
    """A one-element fp32 tensor; with ``num_heads`` also ``[num_heads]`` (per-head)."""
    require_tensor(op, name, scale, dtypes=(torch.float32,), inner_contiguous=False)
    per_head_ok = num_heads is not None and scale.dim() == 1 and scale.size(0) == num_heads
    if scale.numel() != 1 and not per_head_ok:
        expected = "one element" + (f" or shape [{num_heads}] (per head)" if num_heads is not None else "")
        raise ValueError(f"{op}: argument '{name}' must have {expected}, got shape {tuple(scale.shape)}")


def check_is_neox(op: str, is_neox) -> None:
    if not isinstance(is_neox, bool):
        raise TypeError(f"{op}: argument 'is_neox' must be a bool, got {_describe(is_neox)}")


def check_argument_type(op: str, name: str, value, kind: str):
    """What the ``torch.ops`` dispatcher would coerce or reject with a RuntimeError, checked first
    by the public wrappers: ``kind`` is the schema type (``Tensor``, ``Optional[Tensor]``, ``int``,
    ``bool``, ``str``). Returns the value as the op takes it (an ``int`` head size)."""
    if kind == "Tensor" or (kind == "Optional[Tensor]" and value is not None):
        require_tensor(op, name, value, inner_contiguous=False)
    elif kind == "int":
        return check_head_size(op, value) if name == "head_size" else operator.index(value)
    elif kind == "bool":
        check_is_neox(op, value)
    elif kind == "str":
        check_kv_cache_dtype(op, value)
    return value


# ---------------------------------------------------------------- value checks (one sync)


def check_index_values(op: str, *, positions: torch.Tensor | None = None, num_positions: int | None = None,
                       slot_mapping: torch.Tensor | None = None, num_slots: int | None = None,
                       scales: dict[str, torch.Tensor] | None = None) -> None:
    """Checks that read tensor values, with one device sync; raise before any write.

    Positions in ``[0, num_positions)``; valid slots (``>= 0``) below ``num_slots`` and each
    used once; every element of ``scales`` finite and positive (fp8 caches divide by it).
    """
    summary = {}  # name -> 0-d int64 tensor on the device, read back together
    if positions is not None and positions.numel() > 0:
        summary["low"], summary["high"] = positions.min().long(), positions.max().long()
    if slot_mapping is not None and slot_mapping.numel() > 0:
        slots = slot_mapping.long()
        valid = slots >= 0
        summary["top_slot"] = torch.where(valid, slots, -1).max()
        summary["repeats"] = _repeated_slots(slots, valid)
    for name, scale in (scales or {}).items():
        summary[name] = (~(torch.isfinite(scale) & (scale > 0))).sum()
    if not summary:
        return
    found = dict(zip(summary, torch.stack(list(summary.values())).tolist()))  # the one sync
    if "low" in found and (found["low"] < 0 or found["high"] >= num_positions):
        raise ValueError(_position_message(op, positions, num_positions, found))
    if "top_slot" in found and found["top_slot"] >= num_slots:
        token = int((slot_mapping.long() >= num_slots).nonzero()[0])
        raise ValueError(
            f"{op}: argument 'slot_mapping' holds slot {int(slot_mapping[token])} at token {token} but the cache "
            f"has {num_slots} slots (blocks x block size)"
        )
    if found.get("repeats", 0):
        raise ValueError(_repeated_slot_message(op, slot_mapping, found["repeats"]))
    for name, scale in (scales or {}).items():
        if found[name]:
            raise ValueError(
                f"{op}: argument '{name}' must be finite and positive (an fp8 code is x / {name}), "
                f"got {scale.flatten()[:8].tolist()}"
            )


def _repeated_slots(slots: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """How many valid slots equal the one before them in sorted order (no sync)."""
    padding_keys = -1 - torch.arange(slots.numel(), device=slots.device)  # distinct, never equal to a slot
    ordered = torch.where(valid, slots, padding_keys).sort().values
    return (ordered[1:] == ordered[:-1]).sum()


def _position_message(op: str, positions: torch.Tensor, num_positions: int, found: dict) -> str:
    token = int(((positions < 0) | (positions >= num_positions)).nonzero()[0])
    return (f"{op}: argument 'positions' holds {int(positions[token])} at token {token}, outside [0, {num_positions}) "
            f"(the rows of cos_sin_cache); its values span [{found['low']}, {found['high']}]")


def _repeated_slot_message(op: str, slot_mapping: torch.Tensor, repeats: int) -> str:
    slots = slot_mapping.long().cpu()
    valid = slots[slots >= 0]
    values, counts = valid.unique(return_counts=True)
    slot = int(values[counts > 1][0])
    tokens = (slots == slot).nonzero().flatten().tolist()
    listed = ", ".join(map(str, tokens[:-1])) + f" and {tokens[-1]}"
    more = f" ({repeats} repeats in all)" if repeats > len(tokens) - 1 else ""
    return (f"{op}: argument 'slot_mapping' holds slot {slot} for tokens {listed}{more}; "
            "a valid slot may be written by one token only")
