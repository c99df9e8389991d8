"""What a graph shows that a fusion pass registers its patterns for: the cos/sin tables its ropes
index and their dtypes, and how it calls an op (``CallForm``).
"""

from __future__ import annotations

import torch
from torch import fx


def table_lookups(graph: fx.Graph) -> list[fx.Node]:
    """``index``/``index_select`` of a 2-D tensor: where a native rope reads its cos/sin rows."""
    return [node for target in (torch.ops.aten.index.Tensor, torch.ops.aten.index_select.default)
            for node in graph.find_nodes(op="call_function", target=target)
            if isinstance(node.args[0], fx.Node) and node.args[0].meta.get("val") is not None
            and node.args[0].meta["val"].dim() == 2]


def table_dtypes(graph: fx.Graph) -> set[torch.dtype]:
    """dtypes of the cos/sin tables the graph's ropes index (``fp32`` when none is seen)."""
    dtypes = {node.args[0].meta["val"].dtype for node in table_lookups(graph)}
    for node in graph.find_nodes(op="call_function", target=torch.ops.higher_order.auto_functionalized):
        table = node.kwargs.get("cos_sin_cache")
        if isinstance(table, fx.Node) and "val" in table.meta:
            dtypes.add(table.meta["val"].dtype)
    return dtypes or {torch.float32}


class CallForm(tuple):
    """How the graph calls an op: ``(positional argument names, keyword argument names)``, so a
    pattern emits the same call (vLLM's three-argument ``unified_kv_cache_update`` or ours)."""

    @classmethod
    def of(cls, node: fx.Node) -> "CallForm":
        names = [arg.name for arg in node.target._schema.arguments]
        return cls((tuple(names[:len(node.args)]), tuple(sorted(node.kwargs))))

    def call(self, op, **values):
        positional, keywords = self
        return op(*(values[name] for name in positional), **{name: values[name] for name in keywords})
