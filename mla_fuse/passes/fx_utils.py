"""Small helpers over functionalized FX graphs."""

from __future__ import annotations

import operator
from typing import Iterable

import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized
from torch.fx import Graph, Node

aten = torch.ops.aten

# Ops whose result aliases their first argument (a view of it).
VIEW_OPS = frozenset({
    aten.slice.Tensor, aten.select.int, aten.view.default, aten.reshape.default, aten._unsafe_view.default,
    aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.permute.default,
    aten.transpose.int, aten.t.default, aten.expand.default, aten.as_strided.default,
    aten.split_with_sizes.default, aten.split.Tensor, aten.alias.default,
})


def is_op(node: object, *targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def find_auto_functionalized(graph: Graph, op) -> list[Node]:
    return [n for n in graph.find_nodes(op="call_function", target=auto_functionalized) if n.args[0] == op]


def getitem_users(node: Node) -> dict[int, list[Node]]:
    """``{index: [getitem nodes]}`` of a tuple-valued node."""
    items: dict[int, list[Node]] = {}
    for user in node.users:
        if is_op(user, operator.getitem):
            items.setdefault(user.args[1], []).append(user)
    return items


def mutated_arg_names(op) -> list[str]:
    """Names of the arguments ``op`` writes, in schema order (= auto_functionalized's output order)."""
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def num_returns(op) -> int:
    """Index of the first mutated-argument output of ``auto_functionalized(op, ...)``
    (an op returning nothing still takes slot 0, as None)."""
    return max(1, len(op._schema.returns))


def call_args(node: Node) -> dict:
    """``{argument name: value}`` of a call to an ``OpOverload``, defaults filled in."""
    schema = node.target._schema
    values = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    values.update(zip((arg.name for arg in schema.arguments), node.args))
    values.update(node.kwargs)
    return values


def normalize_dim(dim: int, node: Node) -> int:
    return dim % node.meta["val"].dim() if dim < 0 else dim


def position(graph: Graph) -> dict[Node, int]:
    return {node: i for i, node in enumerate(graph.nodes)}


def erase_if_unused(graph: Graph, nodes: Iterable[Node]) -> None:
    for node in nodes:
        if not node._erased and not node.users:
            graph.erase_node(node)
