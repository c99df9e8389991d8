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


def _with_cache_arguments(name: str, schema: str, layer_op):
    """``layer_op`` (a layer's op, which fetches its cache(s) by layer name at run time) as the custom op
    ``mla_fuse_arguments::name`` of ``schema``: ``layer_op``'s arguments with the caches (those named
    ``*cache``) among them, declared written where ``schema`` marks them ``(a!)``. It runs ``layer_op`` with
    those caches in the forward context; its fake is ``layer_op``'s."""
    arguments = torch._C.parse_schema(f"mla_fuse_arguments::{name}{schema}").arguments
    names = [argument.name for argument in arguments]
    caches = [index for index, argument in enumerate(names) if argument.endswith("cache")]
    written = [argument.name for argument in arguments if argument.alias_info and argument.alias_info.is_write]
    layer_name = names.index("layer_name")

    def others(args):
        return [value for index, value in enumerate(args) if index not in caches]

    def run(*args):
        with _caches_in_context(args[layer_name], **{names[index]: args[index] for index in caches}):
            return layer_op._init_fn(*others(args))

    op = torch.library.custom_op(f"mla_fuse_arguments::{name}", run, mutates_args=written, schema=schema)
    op.register_fake(lambda *args: layer_op._abstract_fn(*others(args)))
    return op


_mla_update = _with_cache_arguments(
    "unified_mla_kv_cache_update",
    "(Tensor kv_c, Tensor k_pe, Tensor(a2!) kv_cache, str layer_name, str kv_cache_dtype, Tensor k_scale) -> Tensor",
    unified_ops.unified_mla_kv_cache_update)
_mla_attention = _with_cache_arguments(
    "unified_mla_attention",
    "(Tensor q, Tensor kv_cache, Tensor kv_b_weight, Tensor dummy, str layer_name, SymInt v_head_dim) -> Tensor",
    paged_attention.unified_mla_attention)
_mha_update = _with_cache_arguments(
    "unified_kv_cache_update",
    "(Tensor key, Tensor value, Tensor(a2!) key_cache, Tensor(a3!) value_cache, str layer_name, str kv_cache_dtype) "
    "-> Tensor",
    unified_ops.unified_kv_cache_update)
_mha_attention = _with_cache_arguments(
    "unified_attention",
    "(Tensor query, Tensor key_cache, Tensor value_cache, Tensor dummy, str layer_name, SymInt v_head_size) -> Tensor",
    paged_attention.unified_attention)


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
