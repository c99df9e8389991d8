"""Rotary embeddings, MLA and MHA attention layers, the forward context, and their custom ops."""

from mla_fuse.layers.forward_context import ForwardContext, LayerKVCache, get_forward_context, set_forward_context
from mla_fuse.layers.mha import MHAAttention
from mla_fuse.layers.mla import MLAAttention, RMSNorm
from mla_fuse.layers.rotary_embedding import DeepseekScalingRotaryEmbedding, RotaryEmbedding

__all__ = [
    "DeepseekScalingRotaryEmbedding",
    "ForwardContext",
    "LayerKVCache",
    "MHAAttention",
    "MLAAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "get_forward_context",
    "set_forward_context",
]
