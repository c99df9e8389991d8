"""The copy-free rule's mutant: the design before caches were fetched at run time (docs/PASSES.md).

The layer reads its cache(s) from the forward context while tracing and hands them to the update
(declared as written) and to the attention, so the caches are graph inputs. When they alias (views of
one pool), functionalization rebuilds the updated pool: a copy per step. ``mutants.py`` plants
``mla_attend_with_cache_arguments``/``mha_attend_with_cache_arguments`` as the layers'
``update_and_attend`` (``caches_enter_the_graph``).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from mla_fuse.layers import get_forward_context, paged_attention, unified_ops
from mla_fuse.layers.mha import heads


@contextlib.contextmanager
def _caches_in_context(layer_name: str, **caches):
    context = get_forward_context()
    entry = context.layer(layer_name)
    context.layers[layer_name] = dataclasses.replace(entry, **caches)
    try:
        yield
    finally:
        context.layers[layer_name] = entry


@torch.library.custom_op("mla_fuse_arguments::unified_mla_kv_cache_update", mutates_args=("kv_cache",))
def _mla_update(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, layer_name: str,
                kv_cache_dtype: str, k_scale: torch.Tensor) -> torch.Tensor:
    with _caches_in_context(layer_name, kv_cache=kv_cache):
        return unified_ops.unified_mla_kv_cache_update._init_fn(kv_c, k_pe, layer_name, kv_cache_dtype, k_scale)


@_mla_update.register_fake
def _(kv_c, k_pe, kv_cache, layer_name, kv_cache_dtype, k_scale):
    return kv_c.new_empty(0)


@torch.library.custom_op("mla_fuse_arguments::unified_mla_attention", mutates_args=())
def _mla_attention(q: torch.Tensor, kv_cache: torch.Tensor, kv_b_weight: torch.Tensor, dummy: torch.Tensor,
                   layer_name: str, v_head_dim: int) -> torch.Tensor:
    with _caches_in_context(layer_name, kv_cache=kv_cache):
        return paged_attention.unified_mla_attention._init_fn(q, kv_b_weight, dummy, layer_name, v_head_dim)


@_mla_attention.register_fake
def _(q, kv_cache, kv_b_weight, dummy, layer_name, v_head_dim):
    return q.new_empty(q.size(0), q.size(1), v_head_dim)


@torch.library.custom_op("mla_fuse_arguments::unified_kv_cache_update", mutates_args=("key_cache", "value_cache"))
def _mha_update(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                layer_name: str, kv_cache_dtype: str) -> torch.Tensor:
    with _caches_in_context(layer_name, key_cache=key_cache, value_cache=value_cache):
        return unified_ops.unified_kv_cache_update._init_fn(key, value, layer_name, kv_cache_dtype)


@_mha_update.register_fake
def _(key, value, key_cache, value_cache, layer_name, kv_cache_dtype):
    return key.new_empty(0)


@torch.library.custom_op("mla_fuse_arguments::unified_attention", mutates_args=())
def _mha_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, dummy: torch.Tensor,
                   layer_name: str, v_head_size: int) -> torch.Tensor:
    with _caches_in_context(layer_name, key_cache=key_cache, value_cache=value_cache):
        return paged_attention.unified_attention._init_fn(query, dummy, layer_name, v_head_size)


@_mha_attention.register_fake
def _(query, key_cache, value_cache, dummy, layer_name, v_head_size):
    return query.new_empty(query.size(0), query.size(1), v_head_size)


def mla_attend_with_cache_arguments(self, q, kv_c_normed, k_pe):
    cache = get_forward_context().layer(self.layer_name)
    dummy = _mla_update(kv_c_normed, k_pe, cache.kv_cache, self.layer_name, cache.kv_cache_dtype, cache.k_scale)
    attn = _mla_attention(q, cache.kv_cache, self.kv_b_proj.weight, dummy, self.layer_name, self.v_head_dim)
    return self.o_proj(attn.flatten(1))


def mha_attend_with_cache_arguments(self, q, k, v):
    cache = get_forward_context().layer(self.layer_name)
    dummy = _mha_update(heads(k, self.num_kv_heads, self.head_size), heads(v, self.num_kv_heads, self.head_size),
                        cache.key_cache, cache.value_cache, self.layer_name, cache.kv_cache_dtype)
    attn = _mha_attention(heads(q, self.num_heads, self.head_size), cache.key_cache, cache.value_cache, dummy,
                          self.layer_name, self.head_size)
    return self.o_proj(attn.flatten(1))
