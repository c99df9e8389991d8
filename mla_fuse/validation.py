"""Argument checks shared by the operations (CONTRACT §4, "Bad input").

Every check raises ``ValueError`` or ``TypeError`` whose message names the
operation and the argument and says what was expected and what came. The op
wrappers call the checker of their operation before launching anything, so
bad input never writes.

Shape checks are free (metadata only). Value checks (position past the
table, slot past the cache, duplicate valid slots) need a device sync; they
run when ``check_values=True`` is passed or ``MLA_FUSE_CHECK_VALUES=1`` is set.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
CHECK_VALUES_ENV_VAR = "MLA_FUSE_CHECK_VALUES"

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


def values_checked(check_values: bool | None) -> bool:
    """Whether the syncing value checks run: the keyword, else the env var."""
    if check_values is not None:
        return bool(check_values)
    return os.environ.get(CHECK_VALUES_ENV_VAR, "0") not in ("", "0", "false", "False")


# ---------------------------------------------------------------- primitives


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device})"
    return f"{type(value).__name__} {value!r}"


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


def check_positions(op: str, positions, num_tokens: int) -> None:
    require_tensor(op, "positions", positions, ndim=1, dtypes=INDEX_DTYPES, inner_contiguous=False)
    require_size(op, "positions", positions, 0, num_tokens, "one position per token")


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
    fp8, float8_dtype, named_dtype = KV_CACHE_DTYPES[kv_cache_dtype]
    require_tensor(op, name, cache, ndim=ndim)
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


# ---------------------------------------------------------------- value checks (sync)


def check_index_values(op: str, *, positions: torch.Tensor | None = None, num_positions: int | None = None,
                 slot_mapping: torch.Tensor | None = None, num_slots: int | None = None) -> None:
    """Checks that read tensor values (one device sync each); raise before any write."""
    if positions is not None and positions.numel() > 0:
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= num_positions:
            raise ValueError(
                f"{op}: argument 'positions' must lie in [0, {num_positions}) (rows of cos_sin_cache), "
                f"got values in [{low}, {high}]"
            )
    if slot_mapping is not None and slot_mapping.numel() > 0:
        valid = slot_mapping[slot_mapping >= 0]
        if valid.numel() > 0:
            high = int(valid.max())
            if high >= num_slots:
                raise ValueError(
                    f"{op}: argument 'slot_mapping' holds slot {high} but the cache has {num_slots} slots"
                )
            if torch.unique(valid).numel() != valid.numel():
                raise ValueError(f"{op}: argument 'slot_mapping' holds a valid slot more than once")


# ---------------------------------------------------------------- one checker per operation


def _heads_view_size(op: str, name: str, tensor: torch.Tensor, head_size: int) -> int:
    """Heads of a ``[T, heads, head_size]`` or ``[T, heads * head_size]`` tensor."""
    if tensor.dim() == 3:
        require_size(op, name, tensor, 2, head_size, "head_size")
        return tensor.size(1)
    if tensor.size(1) % head_size != 0:
        raise ValueError(
            f"{op}: argument '{name}' of shape {tuple(tensor.shape)} is not a whole number of heads of "
            f"size {head_size}"
        )
    return tensor.size(1) // head_size


def check_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox,
                           check_values: bool | None = None) -> None:
    op = "rotary_embedding"
    require_tensor(op, "query", query, ndim=(2, 3), dtypes=FLOAT_DTYPES)
    if not isinstance(head_size, int) or isinstance(head_size, bool) or head_size <= 0:
        raise TypeError(f"{op}: argument 'head_size' must be a positive int, got {_describe(head_size)}")
    num_tokens = query.size(0)
    _heads_view_size(op, "query", query, head_size)
    if key is not None:
        require_tensor(op, "key", key, ndim=(2, 3), dtypes=FLOAT_DTYPES)
        require_same_dtype(op, "query", query, key=key)
        require_size(op, "key", key, 0, num_tokens, "tokens of 'query'")
        _heads_view_size(op, "key", key, head_size)
    check_positions(op, positions, num_tokens)
    check_cos_sin_cache(op, cos_sin_cache, query.dtype, None, head_size)
    check_is_neox(op, is_neox)
    require_same_device(op, positions=positions, query=query, key=key, cos_sin_cache=cos_sin_cache)
    if values_checked(check_values):
        check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0))


def _check_mla_cache_args(op: str, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                          scale_name: str = "scale") -> None:
    require_tensor(op, "kv_c", kv_c, ndim=2, dtypes=FLOAT_DTYPES)
    require_tensor(op, "k_pe", k_pe, ndim=2, dtypes=FLOAT_DTYPES)
    require_same_dtype(op, "kv_c", kv_c, k_pe=k_pe)
    num_tokens = kv_c.size(0)
    require_size(op, "k_pe", k_pe, 0, num_tokens, "tokens of 'kv_c'")
    check_kv_cache_dtype(op, kv_cache_dtype)
    check_cache_tensor(op, "kv_cache", kv_cache, 3, kv_cache_dtype, kv_c.dtype)
    require_size(op, "kv_cache", kv_cache, 2, kv_c.size(1) + k_pe.size(1), "entry width L + R")
    check_slot_mapping(op, slot_mapping, num_tokens)
    check_scale(op, scale_name, scale)


def check_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                               check_values: bool | None = None) -> None:
    op = "concat_and_cache_mla"
    _check_mla_cache_args(op, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    require_same_device(op, kv_c=kv_c, k_pe=k_pe, kv_cache=kv_cache, slot_mapping=slot_mapping, scale=scale)
    if values_checked(check_values):
        check_index_values(op, slot_mapping=slot_mapping, num_slots=kv_cache.size(0) * kv_cache.size(1))


def check_concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                          kv_cache, kv_cache_dtype, kv_cache_scale,
                                          check_values: bool | None = None) -> None:
    op = "concat_and_cache_mla_rope_fused"
    require_tensor(op, "q_pe", q_pe, ndim=3, dtypes=FLOAT_DTYPES)
    _check_mla_cache_args(op, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, kv_cache_scale, "kv_cache_scale")
    require_same_dtype(op, "kv_c", kv_c, q_pe=q_pe)
    require_size(op, "q_pe", q_pe, 0, kv_c.size(0), "tokens of 'kv_c'")
    rotary_dim = k_pe.size(1)
    require_size(op, "q_pe", q_pe, 2, rotary_dim, "rotary width R of 'k_pe'")
    check_positions(op, positions, kv_c.size(0))
    check_cos_sin_cache(op, cos_sin_cache, q_pe.dtype, rotary_dim, rotary_dim)
    check_is_neox(op, is_neox)
    require_same_device(op, positions=positions, q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=cos_sin_cache,
                        slot_mapping=slot_mapping, kv_cache=kv_cache, kv_cache_scale=kv_cache_scale)
    if values_checked(check_values):
        check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0), slot_mapping=slot_mapping,
                     num_slots=kv_cache.size(0) * kv_cache.size(1))


def _check_flash_cache_args(op: str, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale) -> None:
    require_tensor(op, "key", key, ndim=3, dtypes=FLOAT_DTYPES)
    require_tensor(op, "value", value, ndim=3, dtypes=FLOAT_DTYPES)
    require_same_dtype(op, "key", key, value=value)
    num_tokens, num_kv_heads = key.size(0), key.size(1)
    require_size(op, "value", value, 0, num_tokens, "tokens of 'key'")
    require_size(op, "value", value, 1, num_kv_heads, "KV heads of 'key'")
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


def check_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                  v_scale, check_values: bool | None = None) -> None:
    op = "reshape_and_cache_flash"
    _check_flash_cache_args(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
    require_same_device(op, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                        slot_mapping=slot_mapping, k_scale=k_scale, v_scale=v_scale)
    if values_checked(check_values):
        check_index_values(op, slot_mapping=slot_mapping, num_slots=key_cache.size(0) * key_cache.size(1))


def check_rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                           cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale,
                                           check_values: bool | None = None) -> None:
    op = "rope_and_reshape_and_cache_flash"
    _check_flash_cache_args(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
    require_tensor(op, "query", query, ndim=3, dtypes=FLOAT_DTYPES)
    require_same_dtype(op, "key", key, query=query)
    require_size(op, "query", query, 0, key.size(0), "tokens of 'key'")
    require_size(op, "query", query, 2, key.size(2), "head size of 'key'")
    if query.size(1) % key.size(1) != 0:
        raise ValueError(
            f"{op}: argument 'query' has {query.size(1)} heads, not a multiple of the {key.size(1)} KV heads"
        )
    check_positions(op, positions, key.size(0))
    check_cos_sin_cache(op, cos_sin_cache, key.dtype, None, key.size(2))
    check_is_neox(op, is_neox)
    require_same_device(op, positions=positions, query=query, key=key, value=value, key_cache=key_cache,
                        value_cache=value_cache, slot_mapping=slot_mapping, cos_sin_cache=cos_sin_cache,
                        k_scale=k_scale, v_scale=v_scale)
    if values_checked(check_values):
        check_index_values(op, positions=positions, num_positions=cos_sin_cache.size(0), slot_mapping=slot_mapping,
                     num_slots=key_cache.size(0) * key_cache.size(1))
