"""Plain eager attention over the paged caches (the back half of the layers).

Not a fast kernel: a reference attention, opaque to the compiler (one custom
op each), so compiled and eager runs compute it with the same torch code and
their outputs can be compared bit for bit. Single sequence, no causal mask:
every query token attends to the cache slots ``ForwardContext.attended_slots``
names (by default the valid slots written this step). With nothing to attend
to (no slot mapping) the output is zeros.

Like the cache updates (``unified_ops``), each op finds its layer's cache(s),
``kv_cache_dtype`` and scales in the forward context by ``layer_name`` at run
time, and takes the dummy the layer's cache update returned as
``kv_cache_dummy_dep`` (vLLM's convention): that data dependency is what
orders the attention after the write.
"""

from __future__ import annotations

import torch

from mla_fuse.layers.forward_context import get_forward_context

_FP8_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def dequantize(entries: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor) -> torch.Tensor:
    """Cache entries as fp32: ``float(code) * scale`` for fp8 caches (uint8 or float8), else a cast."""
    fp8 = _FP8_DTYPES.get(kv_cache_dtype)
    if fp8 is None:
        return entries.float()
    codes = entries.view(fp8) if entries.dtype == torch.uint8 else entries
    return codes.float() * scale.float()


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows ``[S, ...]`` of a paged cache ``[NB, B, ...]`` at the given slots."""
    slots = slots.long()
    return cache[slots // cache.size(1), slots % cache.size(1)]


def _softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(Dqk)) v`` per head in fp32: q ``[T, H, Dqk]``, k ``[S, H, Dqk]``, v ``[S, H, Dv]``."""
    scores = torch.einsum("thd,shd->hts", q.float(), k) / q.size(-1) ** 0.5
    return torch.einsum("hts,shd->thd", scores.softmax(dim=-1), v).contiguous()


@torch.library.custom_op("mla_fuse::unified_mla_attention", mutates_args=())
def unified_mla_attention(
    q: torch.Tensor,
    kv_b_weight: torch.Tensor,
    kv_cache_dummy_dep: torch.Tensor,
    layer_name: str,
    v_head_dim: int,
) -> torch.Tensor:
    """MLA attention: q ``[T, H, nope+R]`` against the layer's cache entries ``[kv_c (L) | k_pe (R)]``,
    keys/values expanded by ``kv_b_weight [H*(nope+Dv), L]``. Returns ``[T, H, Dv]`` in q's dtype."""
    T, H, qk_dim = q.shape
    context = get_forward_context()
    cache = context.layer(layer_name)
    kv_cache, latent_dim = cache.kv_cache, kv_b_weight.size(1)
    nope_dim = qk_dim - (kv_cache.size(-1) - latent_dim)
    slots = context.attended_slots(layer_name)
    if slots is None or slots.numel() == 0:
        return q.new_zeros(T, H, v_head_dim)
    entries = dequantize(_gather(kv_cache, slots), cache.kv_cache_dtype, cache.k_scale)
    latent, k_pe = entries[:, :latent_dim], entries[:, latent_dim:]
    kv = (latent @ kv_b_weight.float().t()).view(-1, H, nope_dim + v_head_dim)
    k_nope, v = kv.split([nope_dim, v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, H, -1)], dim=-1)
    return _softmax_attention(q, k, v).to(q.dtype)


@unified_mla_attention.register_fake
def _(q, kv_b_weight, kv_cache_dummy_dep, layer_name, v_head_dim):
    return q.new_empty(q.size(0), q.size(1), v_head_dim)


@torch.library.custom_op("mla_fuse::unified_attention", mutates_args=())
def unified_attention(
    query: torch.Tensor,
    kv_cache_dummy_dep: torch.Tensor,
    layer_name: str,
    v_head_size: int,
) -> torch.Tensor:
    """MHA/GQA attention: ``query [T, H, D]`` against the layer's flash caches ``[NB, B, Hkv, D|Dv]``
    (``Dv = v_head_size``). Returns ``[T, H, Dv]`` in the query's dtype."""
    context = get_forward_context()
    cache = context.layer(layer_name)
    key_cache, value_cache = cache.key_cache, cache.value_cache
    slots = context.attended_slots(layer_name)
    if slots is None or slots.numel() == 0:
        return query.new_zeros(query.size(0), query.size(1), v_head_size)
    scale_shape = (1, -1, 1)  # [1] or per kv head [Hkv]
    k = dequantize(_gather(key_cache, slots), cache.kv_cache_dtype, cache.k_scale.view(scale_shape))
    v = dequantize(_gather(value_cache, slots), cache.kv_cache_dtype, cache.v_scale.view(scale_shape))
    group = query.size(1) // key_cache.size(-2)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return _softmax_attention(query, k, v).to(query.dtype)


@unified_attention.register_fake
def _(query, kv_cache_dummy_dep, layer_name, v_head_size):
    return query.new_empty(query.size(0), query.size(1), v_head_size)
