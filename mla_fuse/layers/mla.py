"""An MLA attention layer shaped like DeepSeek-V2/V3's (the front half, then a reference attention).

    q      = q_proj(x).view(T, H, nope + R);   q_pe = q[..., nope:]
    latent = kv_a_proj_with_mqa(x)             # [T, L + R]
    kv_c, k_pe = latent.split([L, R], -1);     kv_c = kv_a_layernorm(kv_c)
    q_pe, k_pe = rotary_emb(positions, q_pe, k_pe)   # custom op: in place; native: new tensors,
    q[..., nope:] = q_pe                             #   written back into q
    dummy = unified_mla_kv_cache_update(kv_c, k_pe, layer_name, kv_cache_dtype, k_scale)
    out   = unified_mla_attention(q, kv_b_proj.weight, dummy, layer_name, v_head_dim)   # [T, H, Dv]
    return o_proj(out.flatten(1))

``kv_cache_dtype`` and ``k_scale`` are read from the forward context while tracing (a
literal and a graph input); the cache itself only at run time, by the ops (``unified_ops``).
"""

from __future__ import annotations

import torch
from torch import nn

import mla_fuse.layers.paged_attention  # noqa: F401  (registers mla_fuse::unified_mla_attention)
import mla_fuse.layers.unified_ops  # noqa: F401  (registers mla_fuse::unified_mla_kv_cache_update)
from mla_fuse.layers.forward_context import get_forward_context
from mla_fuse.layers.rotary_embedding import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


class MLAAttention(nn.Module):
    """DeepSeek-style multi-head latent attention with a paged ``[NB, B, L+R]`` cache."""

    def __init__(self, hidden_size: int, num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, kv_lora_rank: int, rotary_emb: RotaryEmbedding, layer_name: str) -> None:
        super().__init__()
        if rotary_emb.rotary_dim != qk_rope_head_dim or rotary_emb.head_size != qk_rope_head_dim:
            raise ValueError("MLA rotary embedding must have head_size == rotary_dim == qk_rope_head_dim")
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.layer_name = layer_name
        self.rotary_emb = rotary_emb
        self.q_proj = nn.Linear(hidden_size, num_heads * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=False)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.forward_with_rope_outputs(positions, hidden_states)[0]

    def forward_with_rope_outputs(self, positions: torch.Tensor, hidden_states: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(output, q [T, H, nope+R] after rope, k_pe [T, R] after rope)``."""
        q = self.q_proj(hidden_states).view(-1, self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        q_pe = q[..., self.qk_nope_head_dim:]
        latent = self.kv_a_proj_with_mqa(hidden_states)
        kv_c, k_pe = latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv_c_normed = self.kv_a_layernorm(kv_c)

        q_pe_rotated, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        if not self.rotary_emb.use_custom_op:  # the native forward returns new tensors
            q[..., self.qk_nope_head_dim:] = q_pe_rotated

        return self.update_and_attend(q, kv_c_normed, k_pe), q, k_pe

    def update_and_attend(self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """Cache write of ``[kv_c | k_pe]``, then attention of the (rotated) q over the cache; ``o_proj``."""
        cache = get_forward_context().layer(self.layer_name)
        dummy = torch.ops.mla_fuse.unified_mla_kv_cache_update(
            kv_c_normed, k_pe, self.layer_name, cache.kv_cache_dtype, cache.k_scale
        )
        attn = torch.ops.mla_fuse.unified_mla_attention(q, self.kv_b_proj.weight, dummy, self.layer_name,
                                                        self.v_head_dim)
        return self.o_proj(attn.flatten(1))
