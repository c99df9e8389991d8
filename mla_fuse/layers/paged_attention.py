"""Plain eager attention over the paged caches (the back half of the layers).

Not a fast kernel: a reference attention, opaque to the compiler (one custom
op each), so compiled and eager runs compute it with the same torch code and
their outputs can be compared bit for bit. Single sequence, no causal mask:
every query token attends to the cache slots ``ForwardContext.attended_slots``
names (by default the valid slots written this step). With nothing to attend
to (no slot mapping) the output is zeros.

Each op takes the dummy returned by the cache update as
``kv_cache_dummy_dep`` (vLLM's convention) besides the updated cache itself.
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
    kv_cache: torch.Tensor,
    kv_b_weight: torch.Tensor,
    kv_cache_dummy_dep: torch.Tensor,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_head_dim: int,
) -> torch.Tensor:
    """MLA attention: q ``[T, H, nope+R]`` against cache entries ``[kv_c (L) | k_pe (R)]``,
    keys/values expanded by ``kv_b_weight [H*(nope+Dv), L]``. Returns ``[T, H, Dv]`` in q's dtype."""
    T, H, qk_dim = q.shape
    rope_dim = kv_cache.size(-1) - kv_b_weight.size(1)
    nope_dim = qk_dim - rope_dim
    slots = get_forward_context().attended_slots(layer_name)
    if slots is None or slots.numel() == 0:
        return q.new_zeros(T, H, v_head_dim)
    entries = dequantize(_gather(kv_cache, slots), kv_cache_dtype, k_scale)
    latent, k_pe = entries[:, : kv_b_weight.size(1)], entries[:, kv_b_weight.size(1):]
    kv = (latent @ kv_b_weight.float().t()).view(-1, H, nope_dim + v_head_dim)
    k_nope, v = kv.split([nope_dim, v_head_dim], dim=-1)
    k = torch.cat([k_nope, k_pe[:, None, :].expand(-1, H, -1)], dim=-1)
    return _softmax_attention(q, k, v).to(q.dtype)


@unified_mla_attention.register_fake
def _(q, kv_cache, kv_b_weight, kv_cache_dummy_dep, layer_name, kv_cache_dtype, k_scale, v_head_dim):
    return q.new_empty(q.size(0), q.size(1), v_head_dim)


@torch.library.custom_op("mla_fuse::unified_attention", mutates_args=())
def unified_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_cache_dummy_dep: torch.Tensor,
    layer_name: str,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> torch.Tensor:
    """MHA/GQA attention: q ``[T, H*D]`` against the flash caches ``[NB, B, Hkv, D|Dv]``.
    Returns ``[T, H, Dv]`` in q's dtype."""
    head_size, num_kv_heads = key_cache.size(-1), key_cache.size(-2)
    q = q.view(q.size(0), -1, head_size)
    slots = get_forward_context().attended_slots(layer_name)
    if slots is None or slots.numel() == 0:
        return q.new_zeros(q.size(0), q.size(1), value_cache.size(-1))
    scale_shape = (1, -1, 1)  # [1] or per kv head [Hkv]
    k = dequantize(_gather(key_cache, slots), kv_cache_dtype, k_scale.view(scale_shape))
    v = dequantize(_gather(value_cache, slots), kv_cache_dtype, v_scale.view(scale_shape))
    group = q.size(1) // num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return _softmax_attention(q, k, v).to(q.dtype)


@unified_attention.register_fake
def _(q, key_cache, value_cache, kv_cache_dummy_dep, layer_name, kv_cache_dtype, k_scale, v_scale):
    return q.new_empty(q.size(0), q.size(1) // key_cache.size(-1) if q.dim() == 2 else q.size(1), value_cache.size(-1))
