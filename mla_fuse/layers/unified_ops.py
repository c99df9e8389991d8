"""Custom ops the attention layers call, and the fused ops the compile passes insert.

Signatures follow vLLM's (CONTRACT §6); each op finds its layer's cache(s), slot
mapping and (MHA) scales in the forward context by ``layer_name`` **at run time**:

    unified_mla_kv_cache_update(kv_c_normed, k_pe, layer_name, kv_cache_dtype, k_scale) -> dummy
    fused_rope_and_unified_mla_kv_cache_update(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox,
                                               layer_name, kv_cache_dtype, k_scale) -> dummy
    unified_kv_cache_update(key, value, layer_name, kv_cache_dtype=None) -> dummy
    fused_rope_and_unified_kv_cache_update(query, key, value, positions, cos_sin_cache, is_neox,
                                           layer_name, kv_cache_dtype=None) -> dummy

How the cache writes are declared to torch
------------------------------------------
The caches are never arguments, so they never enter a compiled graph: a serving
engine's caches are views of one pool (K and V views of one tensor, every layer
a view of the pool), and mutated graph inputs that alias each other are
functionalized through copies of their base (measured: the whole cache copied
per layer per step, docs/PASSES.md). The update ops declare no mutation; the
empty ``dummy`` they return is consumed by the layer's attention op
(``kv_cache_dummy_dep``), which orders every cache read after the write. The
update ops are also registered as having side effects
(``torch.fx.node.has_side_effect``), so neither FX dead-code elimination nor
Inductor's scheduler drops a write whose dummy nobody reads. The fused ops
declare what they write in the graph's tensors: ``q_pe``/``k_pe`` (``query``/
``key``), rotated in place.

Beyond vLLM's signatures: the MHA ops take an optional ``kv_cache_dtype``
(``None``: the layer's, from the context). Our layers pass it, so the cache
format is a literal in the graph, dynamo guards on it, and the fusion pass can
leave formats out of ``fusable_kv_cache_dtypes`` unfused. MLA ``k_pe`` may be
``[T, R]`` or vLLM's ``[T, 1, R]``. A ``kv_cache_dtype`` argument that is not
the context's for that layer is an error (a graph compiled for another format).

Every op resolves its layer with ``ForwardContext.layer``: an unknown name
raises a ``KeyError`` naming the known layers; a known layer without a slot
mapping this step writes nothing (the fused ops then only rotate q and k).
The kernels are the public wrappers of ``mla_fuse.ops`` (validate, then
dispatch). One definition per op: ``torch.library.custom_op`` with every
written tensor argument in ``mutates_args`` and ``register_fake`` right below.
"""

from __future__ import annotations

from typing import Optional

import torch

from mla_fuse import ops
from mla_fuse.layers.forward_context import LayerKVCache, get_forward_context


def _kernels():
    # Looked up at call time, so tests can wrap the public ops to count calls.
    return ops


def _dummy(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty(0)


def _layer(layer_name: str, kv_cache_dtype: str | None, *fields: str) -> tuple[LayerKVCache, torch.Tensor | None]:
    """The layer's cache entry (with ``fields`` set) and this step's slot mapping."""
    context = get_forward_context()
    entry = context.layer(layer_name)
    missing = [field for field in fields if getattr(entry, field) is None]
    if missing:
        raise ValueError(f"forward context: layer {layer_name!r} has no {' / '.join(missing)} "
                         f"(an {'MLA' if 'kv_cache' in fields else 'MHA'} layer needs it)")
    if kv_cache_dtype is not None and kv_cache_dtype != entry.kv_cache_dtype:
        raise ValueError(f"kv_cache_dtype: the op was called with {kv_cache_dtype!r} but layer {layer_name!r} "
                         f"holds a {entry.kv_cache_dtype!r} cache in the forward context")
    return entry, context.slot_mapping_for(layer_name)


def _k_pe_2d(k_pe: torch.Tensor) -> torch.Tensor:
    """``[T, R]`` view of MLA ``k_pe`` given as ``[T, R]`` or vLLM's ``[T, 1, R]``."""
    return k_pe.squeeze(1) if k_pe.dim() == 3 and k_pe.size(1) == 1 else k_pe


def _heads(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``[T, heads, D]`` view of ``x`` (``[T, heads*D]`` or already 3-D)."""
    return x if x.dim() == 3 else x.view(x.size(0), -1, head_size)


# ----------------------------------------------------------------- MLA, unfused


@torch.library.custom_op("mla_fuse::unified_mla_kv_cache_update", mutates_args=())
def unified_mla_kv_cache_update(
    kv_c_normed: torch.Tensor,
    k_pe: torch.Tensor,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
) -> torch.Tensor:
    """Write ``[kv_c | k_pe]`` (``[T, L]``, ``[T, R]``) of each token into the layer's
    ``kv_cache [NB, B, L+R]`` at its slots (``concat_and_cache_mla``). Returns an empty dummy."""
    entry, slot_mapping = _layer(layer_name, kv_cache_dtype, "kv_cache")
    if slot_mapping is not None:
        _kernels().concat_and_cache_mla(kv_c_normed, _k_pe_2d(k_pe), entry.kv_cache, slot_mapping, kv_cache_dtype,
                                        k_scale)
    return _dummy(kv_c_normed)


@unified_mla_kv_cache_update.register_fake
def _(kv_c_normed, k_pe, layer_name, kv_cache_dtype, k_scale):
    return _dummy(kv_c_normed)


# ------------------------------------------------------------------- MLA, fused


@torch.library.custom_op("mla_fuse::fused_rope_and_unified_mla_kv_cache_update", mutates_args=("q_pe", "k_pe"))
def fused_rope_and_unified_mla_kv_cache_update(
    positions: torch.Tensor,
    q_pe: torch.Tensor,
    k_pe: torch.Tensor,
    kv_c: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
) -> torch.Tensor:
    """RoPE of ``q_pe [T, H, R]`` and ``k_pe [T, R]`` in place, then the MLA cache write of the
    rotated ``k_pe`` into the layer's cache (``concat_and_cache_mla_rope_fused``); with no slot
    mapping only the rotation (``rotary_embedding``). Returns an empty dummy."""
    kernels = _kernels()
    entry, slot_mapping = _layer(layer_name, kv_cache_dtype, "kv_cache")
    k_pe = _k_pe_2d(k_pe)
    if slot_mapping is None:
        kernels.rotary_embedding(positions, q_pe, k_pe, q_pe.size(-1), cos_sin_cache, is_neox)
    else:
        kernels.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                                entry.kv_cache, kv_cache_dtype, k_scale)
    return _dummy(kv_c)


@fused_rope_and_unified_mla_kv_cache_update.register_fake
def _(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, layer_name, kv_cache_dtype, k_scale):
    return _dummy(kv_c)


# ----------------------------------------------------------------- MHA, unfused


@torch.library.custom_op("mla_fuse::unified_kv_cache_update", mutates_args=())
def unified_kv_cache_update(
    key: torch.Tensor,
    value: torch.Tensor,
    layer_name: str,
    kv_cache_dtype: Optional[str] = None,
) -> torch.Tensor:
    """Write ``key [T, Hkv, D]`` and ``value [T, Hkv, Dv]`` (or ``[T, Hkv*D]``) into the layer's flash
    caches ``[NB, B, Hkv, D|Dv]`` at its slots (``reshape_and_cache_flash``), scaled by the layer's
    ``k_scale``/``v_scale``. Returns an empty dummy."""
    entry, slot_mapping = _layer(layer_name, kv_cache_dtype, "key_cache", "value_cache")
    if slot_mapping is not None:
        _kernels().reshape_and_cache_flash(
            _heads(key, entry.key_cache.size(-1)), _heads(value, entry.value_cache.size(-1)), entry.key_cache,
            entry.value_cache, slot_mapping, entry.kv_cache_dtype, entry.k_scale, entry.v_scale,
        )
    return _dummy(key)


@unified_kv_cache_update.register_fake
def _(key, value, layer_name, kv_cache_dtype=None):
    return _dummy(key)


# ------------------------------------------------------------------- MHA, fused


@torch.library.custom_op("mla_fuse::fused_rope_and_unified_kv_cache_update", mutates_args=("query", "key"))
def fused_rope_and_unified_kv_cache_update(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    layer_name: str,
    kv_cache_dtype: Optional[str] = None,
) -> torch.Tensor:
    """RoPE of ``query`` and ``key`` in place (head size D = the layer's ``key_cache.size(-1)``), then
    the flash cache write of the rotated ``key`` and ``value`` (``rope_and_reshape_and_cache_flash``);
    with no slot mapping only the rotation. Returns an empty dummy."""
    kernels = _kernels()
    entry, slot_mapping = _layer(layer_name, kv_cache_dtype, "key_cache", "value_cache")
    head_size = entry.key_cache.size(-1)
    if slot_mapping is None:
        kernels.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    else:
        kernels.rope_and_reshape_and_cache_flash(
            positions, _heads(query, head_size), _heads(key, head_size), _heads(value, entry.value_cache.size(-1)),
            entry.key_cache, entry.value_cache, slot_mapping, cos_sin_cache, is_neox, entry.kv_cache_dtype,
            entry.k_scale, entry.v_scale,
        )
    return _dummy(key)


@fused_rope_and_unified_kv_cache_update.register_fake
def _(query, key, value, positions, cos_sin_cache, is_neox, layer_name, kv_cache_dtype=None):
    return _dummy(key)


UNIFIED_MLA_UPDATE = torch.ops.mla_fuse.unified_mla_kv_cache_update.default
FUSED_MLA_UPDATE = torch.ops.mla_fuse.fused_rope_and_unified_mla_kv_cache_update.default
UNIFIED_UPDATE = torch.ops.mla_fuse.unified_kv_cache_update.default
FUSED_UPDATE = torch.ops.mla_fuse.fused_rope_and_unified_kv_cache_update.default

# The updates write memory torch does not see: never drop one, even if its dummy is unused.
for _op in (UNIFIED_MLA_UPDATE, FUSED_MLA_UPDATE, UNIFIED_UPDATE, FUSED_UPDATE):
    torch.fx.node.has_side_effect(_op)
