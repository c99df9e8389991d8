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
from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized

from mla_fuse.layers import rotary_embedding
from mla_fuse.passes.fx_utils import find_auto_functionalized
from mla_fuse.passes.graph_facts import table_lookups

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


def present(graph: fx.Graph) -> list[tuple[str, bool]]:
    """``(form, is_neox)`` pairs worth registering patterns for: the custom op with the styles its
    calls use; both native forms in both styles when the graph indexes a cos/sin table."""
    found = {("custom_op", node.kwargs["is_neox"])
             for node in find_auto_functionalized(graph, torch.ops.mla_fuse.rotary_embedding.default)}
    if table_lookups(graph):
        found |= {(form, is_neox) for form in ("native", "deepseek_native") for is_neox in (False, True)}
    return sorted(found)
