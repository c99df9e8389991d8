"""Custom ops the attention layers call, and the fused ops the compile passes insert.

Every op here resolves its layer by ``layer_name`` in the forward context
(``forward_context.get_forward_context()``): an unknown name raises a
``KeyError`` naming the known layers; a known layer without a slot mapping
this step writes nothing (the fused ops then only rotate q and k). The kernels
are the public wrappers of ``mla_fuse.ops`` (validate, then dispatch).

How the cache writes are declared to torch
------------------------------------------
vLLM's ``unified_kv_cache_update`` fetches the cache inside the op and
declares no mutation; only the dummy result it returns, consumed by the
attention op, keeps the write ordered before the attention. torch then sees a
pure op: a graph pass may drop it when the dummy is unused, merge two
identical calls, or move another cache reader before it.

Here the cache tensor(s) are ordinary arguments listed in ``mutates_args``:
the layer reads them from the forward context at trace time, so dynamo lifts
them to graph inputs (guarded on metadata only: new cache tensors of the same
shape reuse the compiled graph). Functionalization then tracks every cache
write (``auto_functionalized`` returns the new cache, later readers use it,
and the graph ends with a ``copy_`` into the input that Inductor reinplaces),
and the fused ops the passes insert declare the same caches, plus q and k.
The slot mapping and the attended slots are only read, so they stay in the
context. The dummy result is kept for vLLM compatibility: the attention ops
take it as ``kv_cache_dummy_dep`` besides the cache itself.

One definition per op: ``torch.library.custom_op`` with every written tensor
in ``mutates_args`` and ``register_fake`` right below.
"""

from __future__ import annotations

import torch

from mla_fuse import ops
from mla_fuse.layers.forward_context import get_forward_context


def _kernels():
    # Looked up at call time, so tests can wrap the public ops to count calls.
    return ops


def _dummy(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


# ----------------------------------------------------------------- MLA, unfused


@torch.library.custom_op("mla_fuse::unified_mla_kv_cache_update", mutates_args=("kv_cache",))
def unified_mla_kv_cache_update(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
) -> torch.Tensor:
    """Write ``[kv_c | k_pe]`` (``[T, L]``, ``[T, R]``) of each token into ``kv_cache [NB, B, L+R]``
    at the layer's slots (``concat_and_cache_mla``). Returns an empty dummy."""
    slot_mapping = get_forward_context().slot_mapping_for(layer_name)
    if slot_mapping is not None:
        _kernels().concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)
    return _dummy(kv_c)


@unified_mla_kv_cache_update.register_fake
def _(kv_c, k_pe, kv_cache, layer_name, kv_cache_dtype, k_scale):
    return _dummy(kv_c)


# ------------------------------------------------------------------- MLA, fused


@torch.library.custom_op(
    "mla_fuse::fused_rope_and_unified_mla_kv_cache_update", mutates_args=("q_pe", "k_pe", "kv_cache")
)
def fused_rope_and_unified_mla_kv_cache_update(
    q_pe: torch.Tensor,
    k_pe: torch.Tensor,
    kv_c: torch.Tensor,
    kv_cache: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
) -> torch.Tensor:
    """RoPE of ``q_pe [T, H, R]`` and ``k_pe [T, R]`` in place, then the MLA cache write of the
    rotated ``k_pe`` (``concat_and_cache_mla_rope_fused``); with no slot mapping only the
    rotation (``rotary_embedding``). Returns an empty dummy."""
    ops = _kernels()
    slot_mapping = get_forward_context().slot_mapping_for(layer_name)
    if slot_mapping is None:
        ops.rotary_embedding(positions, q_pe, k_pe, q_pe.size(-1), cos_sin_cache, is_neox)
    else:
        ops.concat_and_cache_mla_rope_fused(
            positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype, k_scale
        )
    return _dummy(kv_c)


@fused_rope_and_unified_mla_kv_cache_update.register_fake
def _(q_pe, k_pe, kv_c, kv_cache, positions, cos_sin_cache, is_neox, layer_name, kv_cache_dtype, k_scale):
    return _dummy(kv_c)


# ----------------------------------------------------------------- MHA, unfused


@torch.library.custom_op("mla_fuse::unified_kv_cache_update", mutates_args=("key_cache", "value_cache"))
def unified_kv_cache_update(
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> torch.Tensor:
    """Write ``k [T, Hkv*D]`` and ``v [T, Hkv*Dv]`` (or ``[T, Hkv, D|Dv]``) into the flash caches
    ``[NB, B, Hkv, D|Dv]`` at the layer's slots (``reshape_and_cache_flash``). Returns a dummy."""
    slot_mapping = get_forward_context().slot_mapping_for(layer_name)
    if slot_mapping is not None:
        _kernels().reshape_and_cache_flash(
            _heads(k, key_cache), _heads(v, value_cache), key_cache, value_cache, slot_mapping,
            kv_cache_dtype, k_scale, v_scale,
        )
    return _dummy(k)


@unified_kv_cache_update.register_fake
def _(k, v, key_cache, value_cache, layer_name, kv_cache_dtype, k_scale, v_scale):
    return _dummy(k)


def _heads(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """``[T, heads, D]`` view of ``x`` (``[T, heads*D]`` or already 3-D), D = the cache's head size."""
    return x if x.dim() == 3 else x.view(x.size(0), -1, cache.size(-1))


# ------------------------------------------------------------------- MHA, fused


@torch.library.custom_op(
    "mla_fuse::fused_rope_and_unified_kv_cache_update",
    mutates_args=("q", "k", "key_cache", "value_cache"),
)
def fused_rope_and_unified_kv_cache_update(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> torch.Tensor:
    """RoPE of ``q`` and ``k`` in place (head size D = ``key_cache.size(-1)``), then the flash
    cache write of the rotated ``k`` and ``v`` (``rope_and_reshape_and_cache_flash``); with no
    slot mapping only the rotation. Returns an empty dummy."""
    ops = _kernels()
    slot_mapping = get_forward_context().slot_mapping_for(layer_name)
    head_size = key_cache.size(-1)
    if slot_mapping is None:
        ops.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
    else:
        ops.rope_and_reshape_and_cache_flash(
            positions, _heads(q, key_cache), _heads(k, key_cache), _heads(v, value_cache), key_cache,
            value_cache, slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale,
        )
    return _dummy(k)


@fused_rope_and_unified_kv_cache_update.register_fake
def _(q, k, v, key_cache, value_cache, positions, cos_sin_cache, is_neox, layer_name, kv_cache_dtype,
      k_scale, v_scale):
    return _dummy(k)


UNIFIED_MLA_UPDATE = torch.ops.mla_fuse.unified_mla_kv_cache_update.default
FUSED_MLA_UPDATE = torch.ops.mla_fuse.fused_rope_and_unified_mla_kv_cache_update.default
UNIFIED_UPDATE = torch.ops.mla_fuse.unified_kv_cache_update.default
FUSED_UPDATE = torch.ops.mla_fuse.fused_rope_and_unified_kv_cache_update.default
