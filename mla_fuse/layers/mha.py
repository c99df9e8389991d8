"""An MHA/GQA attention layer with a packed qkv projection and paged flash caches.

    qkv     = qkv_proj(x)                                   # [T, (H + 2*Hkv) * D]
    q, k, v = qkv.split([H*D, Hkv*D, Hkv*D], -1)
    q, k    = rotary_emb(positions, q, k)                   # custom op: in place; native: new tensors
    dummy   = unified_kv_cache_update(heads(k, Hkv), heads(v, Hkv), layer_name, kv_cache_dtype)
    out     = unified_attention(heads(q, H), dummy, layer_name, D)   # [T, H, D]
    return o_proj(out.flatten(1))

``heads(x, n) = x.view(-1, n, D)``. ``kv_cache_dtype`` is read from the forward context while
tracing (a literal of the graph); the caches and scales only at run time, by the ops.
"""

from __future__ import annotations

import torch
from torch import nn

import mla_fuse.layers.paged_attention  # noqa: F401  (registers mla_fuse::unified_attention)
import mla_fuse.layers.unified_ops  # noqa: F401  (registers mla_fuse::unified_kv_cache_update)
from mla_fuse.layers.forward_context import get_forward_context
from mla_fuse.layers.rotary_embedding import RotaryEmbedding


def heads(x: torch.Tensor, num_heads: int, head_size: int) -> torch.Tensor:
    """``[T, num_heads, head_size]`` view of ``x [T, num_heads * head_size]`` (what the cache update
    and the attention take; the fusion pattern traces this same function)."""
    return x.view(-1, num_heads, head_size)


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

        return self.update_and_attend(q, k, v), q, k

    def update_and_attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Cache write of the (rotated) k and v, then attention of q over the caches; ``o_proj``."""
        kv_cache_dtype = get_forward_context().layer(self.layer_name).kv_cache_dtype
        dummy = torch.ops.mla_fuse.unified_kv_cache_update(
            heads(k, self.num_kv_heads, self.head_size), heads(v, self.num_kv_heads, self.head_size),
            self.layer_name, kv_cache_dtype,
        )
        attn = torch.ops.mla_fuse.unified_attention(heads(q, self.num_heads, self.head_size), dummy,
                                                    self.layer_name, self.head_size)
        return self.o_proj(attn.flatten(1))
