"""An MHA/GQA attention layer with a packed qkv projection and paged flash caches.

    qkv     = qkv_proj(x)                                   # [T, (H + 2*Hkv) * D]
    q, k, v = qkv.split([H*D, Hkv*D, Hkv*D], -1)
    q, k    = rotary_emb(positions, q, k)                   # custom op: in place; native: new tensors
    dummy   = unified_kv_cache_update(k, v, key_cache, value_cache, layer_name, kv_cache_dtype, k_scale, v_scale)
    out     = unified_attention(q, key_cache, value_cache, dummy, ...)   # [T, H, D]
    return o_proj(out.flatten(1))

The caches, their dtype and scales come from the forward context by ``layer_name``.
"""

from __future__ import annotations

import torch
from torch import nn

import mla_fuse.layers.paged_attention  # noqa: F401  (registers mla_fuse::unified_attention)
import mla_fuse.layers.unified_ops  # noqa: F401  (registers mla_fuse::unified_kv_cache_update)
from mla_fuse.layers.forward_context import get_forward_context
from mla_fuse.layers.rotary_embedding import RotaryEmbedding


class MHAAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_size: int,
                 rotary_emb: RotaryEmbedding, layer_name: str) -> None:
        super().__init__()
        if rotary_emb.head_size != head_size:
            raise ValueError(f"rotary embedding head_size {rotary_emb.head_size} != layer head_size {head_size}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.layer_name = layer_name
        self.rotary_emb = rotary_emb
        self.qkv_proj = nn.Linear(hidden_size, (num_heads + 2 * num_kv_heads) * head_size, bias=False)
        self.o_proj = nn.Linear(num_heads * head_size, hidden_size, bias=False)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.forward_with_rope_outputs(positions, hidden_states)[0]

    def forward_with_rope_outputs(self, positions: torch.Tensor, hidden_states: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(output, q [T, H*D] after rope, k [T, Hkv*D] after rope)``."""
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        q, k, v = self.qkv_proj(hidden_states).split([q_size, kv_size, kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)

        cache = get_forward_context().layer(self.layer_name)
        dummy = torch.ops.mla_fuse.unified_kv_cache_update(
            k, v, cache.key_cache, cache.value_cache, self.layer_name, cache.kv_cache_dtype,
            cache.k_scale, cache.v_scale,
        )
        attn = torch.ops.mla_fuse.unified_attention(
            q, cache.key_cache, cache.value_cache, dummy, self.layer_name, cache.kv_cache_dtype,
            cache.k_scale, cache.v_scale,
        )
        return self.o_proj(attn.flatten(1)), q, k
