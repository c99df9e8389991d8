"""One checker per operation (CONTRACT §4, "Bad input"; the rules: docs/INPUTS.md), and the switch of
the value checks.

Every check raises ``ValueError`` or ``TypeError`` whose message names the operation and the
argument and says what was expected and what came (the rules themselves:
``mla_fuse.argument_checks``). The custom ops of ``mla_fuse.ops`` run the checker of their
operation in their body, before any launch, so the rules hold on every path into a kernel: the
public wrappers and the ``torch.ops.mla_fuse.*`` entry points that compiled graphs call.

Sync-free checks read only metadata (ranks, sizes, dtypes, strides, devices, and the addresses
that tell whether a written buffer overlaps another argument); they always run. Value checks
read tensor values with one device sync: a position past the table, a slot past the cache, a
valid slot written twice, an fp8 scale that is not finite and positive. They run when
``check_values=True`` is passed to a public wrapper (``checking_values``) or
``MLA_FUSE_CHECK_VALUES=1`` is set; without them such input reads or writes out of bounds.

A checker runs its operation's own rules (written out below), then two checks derived from the
operation's declaration (``mla_fuse.signatures``): one device for every tensor argument, and no
overlap of a written argument with any other; then, when asked, the value checks. It remembers
the layouts it passed and returns each one's slot, where the launch keeps its plan
(``mla_fuse.layouts``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Callable

import torch

from mla_fuse import layouts, signatures
from mla_fuse.argument_checks import (FLOAT_DTYPES, INDEX_DTYPES, KV_CACHE_DTYPES, check_argument_type,
                                      check_cache_tensor, check_cos_sin_cache, check_head_size, check_index_values,
                                      check_is_neox, check_kv_cache_dtype, check_no_overlap, check_positions,
                                      check_scale, check_slot_mapping, fp8_format, require_kernel_device,
                                      require_nonempty, require_same_device, require_same_dtype, require_same_tokens,
                                      require_size, require_tensor)

__all__ = ["CHECK_VALUES_ENV_VAR", "CHECKERS", "FLOAT_DTYPES", "INDEX_DTYPES", "KV_CACHE_DTYPES", "check_argument_type",
           "check_concat_and_cache_mla", "check_concat_and_cache_mla_rope_fused", "check_index_values",
           "check_reshape_and_cache_flash", "check_rope_and_reshape_and_cache_flash", "check_rotary_embedding",
           "checking_values", "fp8_format", "overlap_check", "require_kernel_device", "require_same_device",
           "same_device_check", "values_checked"]

CHECK_VALUES_ENV_VAR = "MLA_FUSE_CHECK_VALUES"

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


# ---------------------------------------------------------------- the checks derived from a declaration


def same_device_check(operation: signatures.Operation) -> Callable[..., None]:
    """``check(*args)``: every tensor argument of ``operation`` on one device (``None`` ones skipped);
    the first one that is not on the first one's device is named. The op's fake is this check."""
    name, tensors = operation.name, tuple((p, operation.index(p)) for p in operation.tensors)
    indices = tuple(i for _, i in tensors)

    def check(*args) -> None:
        first = None
        for i in indices:
            tensor = args[i]
            if tensor is not None:
                if first is None:
                    first = tensor.device
                elif tensor.device != first:  # the message names the first odd one out
                    require_same_device(name, **{p: args[i] for p, i in tensors})

    return check


def overlap_check(operation: signatures.Operation) -> Callable[..., None]:
    """``check(*args)``: no argument ``operation`` writes overlaps itself or another argument
    (``check_no_overlap``; written: the parameters declared written, read: the other tensors)."""
    name, written = operation.name, frozenset(operation.written)
    tensors = tuple((p, operation.index(p)) for p in (*operation.written, *operation.read))

    def check(*args) -> None:
        check_no_overlap(name, {p: args[i] for p, i in tensors}, written)

    return check


ValueChecks = Callable[[], None]  # an operation's value checks, bound to its arguments (one device sync)


def _checker(operation: signatures.Operation):
    """Make ``rules(op, *args)`` (the operation's own rules, ``op`` its name for the messages; they
    return its value checks) the operation's checker ``check(*args, check_values=None)``: the
    rules, one device, no overlap, then the value checks when ``values_checked(check_values)``;
    the layouts it passed remembered (``layouts.remembering``)."""
    name, same_device, no_overlap = operation.name, same_device_check(operation), overlap_check(operation)

    def decorate(rules):
        def check(*args, check_values: bool | None = None) -> None:
            value_checks = rules(name, *args)
            same_device(*args)
            no_overlap(*args)
            if values_checked(check_values):
                value_checks()

        check.__name__ = check.__qualname__ = rules.__name__
        check.__doc__ = rules.__doc__
        return layouts.remembering(check, operation.names, no_overlap, values_checked)

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


@_checker(signatures.ROTARY_EMBEDDING)
def check_rotary_embedding(op: str, positions, query, key, head_size, cos_sin_cache, is_neox) -> ValueChecks:
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
    return lambda: check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0))


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


@_checker(signatures.CONCAT_AND_CACHE_MLA)
def check_concat_and_cache_mla(op: str, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> ValueChecks:
    _check_mla_cache_args(op, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    return lambda: check_index_values(op, slot_mapping=slot_mapping, num_slots=kv_cache.size(0) * kv_cache.size(1),
                                      scales=_fp8_scales(kv_cache_dtype, scale=scale))


@_checker(signatures.CONCAT_AND_CACHE_MLA_ROPE_FUSED)
def check_concat_and_cache_mla_rope_fused(op: str, positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox,
                                          slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale) -> ValueChecks:
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
    return lambda: check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0),
                                      slot_mapping=slot_mapping, num_slots=kv_cache.size(0) * kv_cache.size(1),
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


@_checker(signatures.RESHAPE_AND_CACHE_FLASH)
def check_reshape_and_cache_flash(op: str, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                  k_scale, v_scale) -> ValueChecks:
    _check_flash_cache_args(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
    return lambda: check_index_values(op, slot_mapping=slot_mapping, num_slots=key_cache.size(0) * key_cache.size(1),
                                      scales=_fp8_scales(kv_cache_dtype, k_scale=k_scale, v_scale=v_scale))


@_checker(signatures.ROPE_AND_RESHAPE_AND_CACHE_FLASH)
def check_rope_and_reshape_and_cache_flash(op: str, positions, query, key, value, key_cache, value_cache,
                                           slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype, k_scale,
                                           v_scale) -> ValueChecks:
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
    return lambda: check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0),
                                      slot_mapping=slot_mapping, num_slots=key_cache.size(0) * key_cache.size(1),
                                      scales=_fp8_scales(kv_cache_dtype, k_scale=k_scale, v_scale=v_scale))


# operation -> its checker (written out: docs/STYLE.md 14); the op's body calls it through this table
CHECKERS = {
    "rotary_embedding": check_rotary_embedding,
    "concat_and_cache_mla": check_concat_and_cache_mla,
    "concat_and_cache_mla_rope_fused": check_concat_and_cache_mla_rope_fused,
    "reshape_and_cache_flash": check_reshape_and_cache_flash,
    "rope_and_reshape_and_cache_flash": check_rope_and_reshape_and_cache_flash,
}
