"""Argument checks shared by the operations (CONTRACT §4, "Bad input"; the rules: docs/INPUTS.md).

Every check raises ``ValueError`` or ``TypeError`` whose message names the operation and the
argument and says what was expected and what came. The custom ops of ``mla_fuse.ops`` run
the checker of their operation in their body, before any launch, so the rules hold on every
path into a kernel: the public wrappers and the ``torch.ops.mla_fuse.*`` entry points that
compiled graphs call.

Sync-free checks read only metadata (ranks, sizes, dtypes, strides, devices, and the
addresses that tell whether a written buffer overlaps another argument); they always run.
Value checks read tensor values with one device sync: a position past the table, a slot
past the cache, a valid slot written twice, an fp8 scale that is not finite and positive.
They run when ``check_values=True`` is passed to a public wrapper (``checking_values``) or
``MLA_FUSE_CHECK_VALUES=1`` is set; without them such input reads or writes out of bounds.

The sync-free verdict depends only on the arguments' metadata, so each checker remembers the
layouts it passed (addresses, sizes, strides, dtypes, devices of the tensors and the other
arguments as given, up to ``KNOWN_LAYOUTS_PER_OPERATION`` of them): a serving loop that calls
an operation on the same buffers again pays for building that key, not for the checks. Of the
checks only the overlap of written buffers reads addresses, so a layout whose shapes (everything
but the addresses) a checker passed before, at other addresses, runs that check alone: the layers
of one step after the first (each its own cache, the same activations' shapes). A checker
called without value checks returns the layout's *slot*, a one-element list that lives as long as
the layout is remembered (None when it is not): the op keeps there what its launch derives from the
layout (``mla_fuse.kernels.config.planned``), so a call on known buffers computes neither the checks
nor the launch's sizes, strides and configuration again.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import inspect
import operator
import os
from typing import Sequence

import torch

from mla_fuse import overlap

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
CHECK_VALUES_ENV_VAR = "MLA_FUSE_CHECK_VALUES"
KNOWN_LAYOUTS_PER_OPERATION = 1024

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


# ---------------------------------------------------------------- the value-check switch

_CHECK_VALUES = contextvars.ContextVar("mla_fuse_check_values", default=None)


def values_checked(check_values: bool | None = None) -> bool:
    """Whether the syncing value checks run: the argument, else ``checking_values``, else the env var."""
    if check_values is None:
        check_values = _CHECK_VALUES.get()
    if check_values is not None:
        return bool(check_values)
    return os.environ.get(CHECK_VALUES_ENV_VAR, "0") not in ("", "0", "false", "False")


@contextlib.contextmanager
def checking_values(check_values: bool | None):
    """Value checks on (``True``) or off (``False``) for the op calls inside; ``None`` changes nothing."""
    if check_values is None:
        yield
        return
    token = _CHECK_VALUES.set(bool(check_values))
    try:
        yield
    finally:
        _CHECK_VALUES.reset(token)


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


def check_no_overlap(op: str, written: dict[str, torch.Tensor | None], read: dict[str, torch.Tensor | None]) -> None:
    """No written argument maps two indices to one element or shares memory with another argument
    (``None`` arguments are skipped). Decided from addresses, sizes and strides (``mla_fuse.overlap``);
    needs no device sync. Meta tensors have no memory and are never checked."""
    if next(iter(written.values())).is_meta:
        return
    try:
        found = overlap.first_overlap(written, read)
    except overlap.TooHard as error:
        raise ValueError(f"{op}: cannot tell whether the arguments {sorted(written)} overlap any other argument "
                         f"({error}); pass buffers in ordinary layouts") from None
    if found is None:
        return
    name, other = found
    tensor = written[name]
    if other is None:
        raise ValueError(
            f"{op}: argument '{name}' maps several indices to one element ({_layout(tensor)}: an expand()ed or "
            "stride-0 view?); a written argument needs its own element at every index"
        )
    raise ValueError(
        f"{op}: arguments '{name}' ({_layout(tensor)}) and '{other}' ({_layout(written.get(other, read.get(other)))}) "
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


# ---------------------------------------------------------------- layouts already checked

_KNOWN_LAYOUTS: dict[str, dict[tuple, list]] = {}  # checker name -> layouts it passed -> each one's slot
_KNOWN_SHAPES: dict[str, set] = {}  # checker name -> the address-free parts of those layouts


def forget_layouts() -> None:
    """Forget every layout the checkers passed (the next call of each checks again)."""
    for known in (*_KNOWN_LAYOUTS.values(), *_KNOWN_SHAPES.values()):
        known.clear()


def _layout_key(args: tuple) -> tuple:
    """Everything the sync-free checks read, as ``(shapes, addresses)``: ``shapes`` holds each tensor's
    sizes, strides, dtype and device and every other argument with its type (``True`` is not ``1``),
    ``addresses`` each tensor's address. Raises ``RuntimeError`` for a tensor without storage; hashing
    the key raises ``TypeError`` for an unhashable argument.

    Its cost is a known layout's whole cost, so it is built as cheaply as measured
    (``python benchmarks/bench_validation.py``, ``same``; fused MLA, 8 tensors): the five attribute
    reads per tensor are 3.1 us of it, the loop and one hash with the lookup's compare the rest.
    (Before: a generator with each tensor's type, hashed twice, 5.3 us; one comprehension of
    per-tensor tuples, 4.5 us; this loop costs what that comprehension did.)"""
    shapes, addresses = [], []
    for value in args:
        if isinstance(value, torch.Tensor):
            shapes.append((value.shape, value.stride(), value.dtype, value.device))
            addresses.append(value.data_ptr())
        else:
            shapes.append((type(value), value))
    return tuple(shapes), tuple(addresses)


def _remembering_layouts(overlap_checker):
    """Decorate ``checker(*args, check_values)`` so that it skips what it checked before: a layout it
    passed (the same key, ``_layout_key``) returns that layout's slot (module docstring) without
    checking; a layout whose shapes it passed at other addresses (another layer's cache, the same
    step's activations) runs only ``overlap_checker(*args)``, the one check that reads addresses.
    With value checks on it always runs in full and returns None. Arguments may come by position or
    by name."""

    def decorate(checker):
        known = _KNOWN_LAYOUTS.setdefault(checker.__name__, {})
        shapes_known = _KNOWN_SHAPES.setdefault(checker.__name__, set())
        names = tuple(inspect.signature(checker).parameters)[:-1]  # all but check_values

        @functools.wraps(checker)
        def check(*args, check_values: bool | None = None, **named) -> list | None:
            if named:
                args = (*args, *(named.pop(name) for name in names[len(args):] if name in named))
            if named or len(args) != len(names):
                checker(*args, **named, check_values=check_values)  # raises the TypeError of a wrong call
                return None
            if values_checked(check_values):
                checker(*args, check_values=True)
                return None
            try:
                key = _layout_key(args)
                slot = known.get(key)  # hashed once: the lookup is the only hash on a hit
                if slot is not None:
                    return slot
                shapes_passed = key[0] in shapes_known
            except (TypeError, RuntimeError):  # an unhashable argument, a tensor without storage: no key
                key, shapes_passed = None, False
            if shapes_passed:
                overlap_checker(*args)
            else:
                checker(*args, check_values=False)
            if key is None:
                return None
            if len(known) >= KNOWN_LAYOUTS_PER_OPERATION:
                known.clear()  # start over (atomic: calls from several threads stay safe)
                shapes_known.clear()
            shapes_known.add(key[0])
            slot = known[key] = [None]
            return slot

        return check

    return decorate


# ---------------------------------------------------------------- one checker per operation


def _heads_view_size(op: str, name: str, tensor: torch.Tensor, head_size: int) -> int:
    """Heads of a ``[T, heads, head_size]`` or ``[T, heads * head_size]`` tensor (at least one)."""
    if tensor.dim() == 3:
        require_size(op, name, tensor, 2, head_size, "head_size")
        require_nonempty(op, name, tensor, heads=1)
        return tensor.size(1)
    if tensor.size(1) % head_size != 0 or tensor.size(1) == 0:
        raise ValueError(
            f"{op}: argument '{name}' of shape {tuple(tensor.shape)} is not a positive whole number of heads "
            f"of size {head_size}"
        )
    return tensor.size(1) // head_size


def _rotary_embedding_overlap(positions, query, key, head_size, cos_sin_cache, is_neox) -> None:
    check_no_overlap("rotary_embedding", dict(query=query, key=key),
                     dict(positions=positions, cos_sin_cache=cos_sin_cache))


@_remembering_layouts(_rotary_embedding_overlap)
def check_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox,
                           check_values: bool | None = None) -> None:
    op = "rotary_embedding"
    head_size = check_head_size(op, head_size)
    require_tensor(op, "query", query, ndim=(2, 3), dtypes=FLOAT_DTYPES)
    check_positions(op, positions)
    if key is None:
        require_same_tokens(op, positions=positions.size(0), query=query.size(0))
    else:
        require_tensor(op, "key", key, ndim=(2, 3), dtypes=FLOAT_DTYPES)
        require_same_dtype(op, "query", query, key=key)
        require_same_tokens(op, positions=positions.size(0), query=query.size(0), key=key.size(0))
    _heads_view_size(op, "query", query, head_size)  # query first: a head_size that fits neither names it
    if key is not None:
        _heads_view_size(op, "key", key, head_size)
    check_cos_sin_cache(op, cos_sin_cache, query.dtype, None, head_size)
    check_is_neox(op, is_neox)
    require_same_device(op, positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    _rotary_embedding_overlap(positions, query, key, head_size, cos_sin_cache, is_neox)
    if values_checked(check_values):
        check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0))


def _check_mla_cache_args(op: str, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                          scale_name: str = "scale", **other_tokens: int) -> int:
    """The arguments both MLA operations take; returns the token count."""
    require_tensor(op, "kv_c", kv_c, ndim=2, dtypes=FLOAT_DTYPES)
    require_tensor(op, "k_pe", k_pe, ndim=2, dtypes=FLOAT_DTYPES)
    require_same_dtype(op, "kv_c", kv_c, k_pe=k_pe)
    num_tokens = require_same_tokens(op, kv_c=kv_c.size(0), k_pe=k_pe.size(0), **other_tokens)
    require_nonempty(op, "kv_c", kv_c, latent_width=1)
    require_nonempty(op, "k_pe", k_pe, rotary_width=1)
    check_kv_cache_dtype(op, kv_cache_dtype)
    check_cache_tensor(op, "kv_cache", kv_cache, 3, kv_cache_dtype, kv_c.dtype)
    require_size(op, "kv_cache", kv_cache, 2, kv_c.size(1) + k_pe.size(1), "entry width L + R")
    check_slot_mapping(op, slot_mapping, num_tokens)
    check_scale(op, scale_name, scale)
    return num_tokens


def _fp8_scales(kv_cache_dtype: str, **scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """The scales a value check must see: only an fp8 cache divides by them."""
    return scales if fp8_format(kv_cache_dtype) is not None else {}


def _concat_and_cache_mla_overlap(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> None:
    check_no_overlap("concat_and_cache_mla", dict(kv_cache=kv_cache),
                     dict(kv_c=kv_c, k_pe=k_pe, slot_mapping=slot_mapping, scale=scale))


@_remembering_layouts(_concat_and_cache_mla_overlap)
def check_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                               check_values: bool | None = None) -> None:
    op = "concat_and_cache_mla"
    _check_mla_cache_args(op, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    require_same_device(op, kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, scale=scale)
    _concat_and_cache_mla_overlap(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    if values_checked(check_values):
        check_index_values(op, slot_mapping=slot_mapping, num_slots=kv_cache.size(0) * kv_cache.size(1),
                           scales=_fp8_scales(kv_cache_dtype, scale=scale))


def _concat_and_cache_mla_rope_fused_overlap(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                             kv_cache, kv_cache_dtype, kv_cache_scale) -> None:
    check_no_overlap("concat_and_cache_mla_rope_fused", dict(q_pe=q_pe, k_pe=k_pe, kv_cache=kv_cache),
                     dict(kv_c=kv_c, positions=positions, cos_sin_cache=cos_sin_cache, slot_mapping=slot_mapping,
                          kv_cache_scale=kv_cache_scale))


@_remembering_layouts(_concat_and_cache_mla_rope_fused_overlap)
def check_concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                          kv_cache, kv_cache_dtype, kv_cache_scale,
                                          check_values: bool | None = None) -> None:
    op = "concat_and_cache_mla_rope_fused"
    require_tensor(op, "q_pe", q_pe, ndim=3, dtypes=FLOAT_DTYPES)
    check_positions(op, positions)
    _check_mla_cache_args(op, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, kv_cache_scale, "kv_cache_scale",
                          q_pe=q_pe.size(0), positions=positions.size(0))
    require_same_dtype(op, "kv_c", kv_c, q_pe=q_pe)
    rotary_dim = k_pe.size(1)
    require_size(op, "q_pe", q_pe, 2, rotary_dim, "rotary width R of 'k_pe'")
    require_nonempty(op, "q_pe", q_pe, heads=1)
    check_cos_sin_cache(op, cos_sin_cache, q_pe.dtype, rotary_dim, rotary_dim)
    check_is_neox(op, is_neox)
    require_same_device(op, positions=positions, q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=cos_sin_cache,
                        slot_mapping=slot_mapping, kv_cache=kv_cache, kv_cache_scale=kv_cache_scale)
    _concat_and_cache_mla_rope_fused_overlap(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                             kv_cache, kv_cache_dtype, kv_cache_scale)
    if values_checked(check_values):
        check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0), slot_mapping=slot_mapping,
                           num_slots=kv_cache.size(0) * kv_cache.size(1),
                           scales=_fp8_scales(kv_cache_dtype, kv_cache_scale=kv_cache_scale))


def _check_flash_cache_args(op: str, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale, **other_tokens: int) -> int:
    """The arguments both MHA operations take; returns the token count."""
    require_tensor(op, "key", key, ndim=3, dtypes=FLOAT_DTYPES)
    require_tensor(op, "value", value, ndim=3, dtypes=FLOAT_DTYPES)
    require_same_dtype(op, "key", key, value=value)
    num_tokens = require_same_tokens(op, key=key.size(0), value=value.size(0), **other_tokens)
    require_nonempty(op, "key", key, kv_heads=1, head_size=2)
    num_kv_heads = key.size(1)
    require_size(op, "value", value, 1, num_kv_heads, "KV heads of 'key'")
    require_nonempty(op, "value", value, head_size=2)
    check_kv_cache_dtype(op, kv_cache_dtype)
    check_cache_tensor(op, "key_cache", key_cache, 4, kv_cache_dtype, key.dtype)
    check_cache_tensor(op, "value_cache", value_cache, 4, kv_cache_dtype, key.dtype)
    require_size(op, "key_cache", key_cache, 2, num_kv_heads, "KV heads")
    require_size(op, "key_cache", key_cache, 3, key.size(2), "head size of 'key'")
    require_size(op, "value_cache", value_cache, 0, key_cache.size(0), "blocks of 'key_cache'")
    require_size(op, "value_cache", value_cache, 1, key_cache.size(1), "block size of 'key_cache'")
    require_size(op, "value_cache", value_cache, 2, num_kv_heads, "KV heads")
    require_size(op, "value_cache", value_cache, 3, value.size(2), "head size of 'value'")
    check_slot_mapping(op, slot_mapping, num_tokens)
    check_scale(op, "k_scale", k_scale, num_kv_heads)
    check_scale(op, "v_scale", v_scale, num_kv_heads)
    return num_tokens


def _reshape_and_cache_flash_overlap(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                     v_scale) -> None:
    check_no_overlap("reshape_and_cache_flash", dict(key_cache=key_cache, value_cache=value_cache),
                     dict(key=key, value=value, slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale))


@_remembering_layouts(_reshape_and_cache_flash_overlap)
def check_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                  v_scale, check_values: bool | None = None) -> None:
    op = "reshape_and_cache_flash"
    _check_flash_cache_args(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
    require_same_device(op, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                        slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale)
    _reshape_and_cache_flash_overlap(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
    if values_checked(check_values):
        check_index_values(op, slot_mapping=slot_mapping, num_slots=key_cache.size(0) * key_cache.size(1),
                           scales=_fp8_scales(kv_cache_dtype, k_scale=k_scale, v_scale=v_scale))


def _rope_and_reshape_and_cache_flash_overlap(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                              cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale) -> None:
    check_no_overlap("rope_and_reshape_and_cache_flash",
                     dict(query=query, key=key, key_cache=key_cache, value_cache=value_cache),
                     dict(value=value, positions=positions, slot_mapping=slot_mapping, cos_sin_cache=cos_sin_cache,
                          k_scale=k_scale, v_scale=v_scale))


@_remembering_layouts(_rope_and_reshape_and_cache_flash_overlap)
def check_rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                           cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale,
                                           check_values: bool | None = None) -> None:
    op = "rope_and_reshape_and_cache_flash"
    require_tensor(op, "query", query, ndim=3, dtypes=FLOAT_DTYPES)
    check_positions(op, positions)
    _check_flash_cache_args(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                            query=query.size(0), positions=positions.size(0))
    require_same_dtype(op, "key", key, query=query)
    require_size(op, "query", query, 2, key.size(2), "head size of 'key'")
    if query.size(1) % key.size(1) != 0 or query.size(1) == 0:
        raise ValueError(
            f"{op}: argument 'query' has {query.size(1)} heads, not a positive multiple of the {key.size(1)} KV heads"
        )
    check_cos_sin_cache(op, cos_sin_cache, key.dtype, None, key.size(2))
    check_is_neox(op, is_neox)
    require_same_device(op, positions=positions, query=query, key=key, value=value, key_cache=key_cache,
                        value_cache=value_cache, slot_mapping=slot_mapping, cos_sin_cache=cos_sin_cache,
                        k_scale=k_scale, v_scale=v_scale)
    _rope_and_reshape_and_cache_flash_overlap(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                              cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale)
    if values_checked(check_values):
        check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0), slot_mapping=slot_mapping,
                           num_slots=key_cache.size(0) * key_cache.size(1),
                           scales=_fp8_scales(kv_cache_dtype, k_scale=k_scale, v_scale=v_scale))
