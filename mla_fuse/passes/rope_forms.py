"""The forms a RoPE takes in a functionalized graph, as pattern-tracing functions.

Each form is called inside a pattern function and emits the graph that form
leaves after tracing: ``form(positions, query, key, cos_sin_cache, head_size,
rotary_dim, is_neox) -> (rotated query, rotated key)``.

* ``custom_op``: ``auto_functionalized(mla_fuse.rotary_embedding, ...)`` and its two outputs.
* ``native``: ``rope_native`` of ``mla_fuse.layers.rotary_embedding`` (``a*cos - b*sin`` form).
* ``deepseek_native``: ``deepseek_rope_native`` (``x*cos' + rotate(x)*sin'``, DeepSeek/vLLM form).

The native forms call the very functions the layers run, so a change to the
layers' formula changes the patterns with it (and the pass hash, which covers
that module's source).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized

from mla_fuse.layers import rotary_embedding

RopeForm = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def custom_op(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox):
    result = auto_functionalized(
        torch.ops.mla_fuse.rotary_embedding.default,
        positions=positions, query=query, key=key, head_size=head_size,
        cos_sin_cache=cos_sin_cache, is_neox=is_neox,
    )
    return result[1], result[2]


def native(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox):
    return rotary_embedding.rope_native(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox)


def deepseek_native(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox):
    return rotary_embedding.deepseek_rope_native(positions, query, key, cos_sin_cache, head_size, rotary_dim,
                                                 is_neox)


FORMS: dict[str, RopeForm] = {"custom_op": custom_op, "native": native, "deepseek_native": deepseek_native}
