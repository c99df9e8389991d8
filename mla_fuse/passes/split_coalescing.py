"""Split coalescing: one ``split_with_sizes`` per (tensor, sizes, dim).

Functionalization re-splits a packed buffer each time a view of it is used
after a mutation, so one logical ``q, k, v = qkv.split(...)`` becomes several
identical splits. ``ScatterSplitReplacementPass`` expects one.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from mla_fuse.passes.fx_utils import getitem_users, normalize_dim
from mla_fuse.passes.inductor_pass import MlaFusePass

SPLIT = torch.ops.aten.split_with_sizes.default


class SplitCoalescingPattern:
    """Matched graph and replacement::

        s1 = split_with_sizes(x, sizes, dim);  a = s1[i]
        s2 = split_with_sizes(x, sizes, dim);  b = s2[j]      # same x, sizes, dim
        -->
        s1 = split_with_sizes(x, sizes, dim);  a = s1[i];  b = s1[j]
    """

    @staticmethod
    def key(split: Node) -> tuple:
        source, sizes, dim = split.args[0], tuple(split.args[1]), split.args[2] if len(split.args) > 2 else 0
        return source, sizes, normalize_dim(dim, source)

    @staticmethod
    def merge(graph: Graph, keep: Node, duplicate: Node) -> None:
        kept_items = getitem_users(keep)
        for index, items in getitem_users(duplicate).items():
            if index not in kept_items:
                with graph.inserting_after(keep):
                    kept_items[index] = [graph.call_function(operator.getitem, (keep, index))]
                    kept_items[index][0].meta.update(items[0].meta)
            for item in items:
                item.replace_all_uses_with(kept_items[index][0])
                graph.erase_node(item)
        graph.erase_node(duplicate)


class SplitCoalescingPass(MlaFusePass):
    name = "split_coalescing"

    def run(self, graph: Graph) -> int:
        first: dict[tuple, Node] = {}
        merged = 0
        for split in list(graph.find_nodes(op="call_function", target=SPLIT)):
            key = SplitCoalescingPattern.key(split)
            if key not in first:
                first[key] = split
                continue
            if any(user.target is not operator.getitem for user in split.users):
                continue
            SplitCoalescingPattern.merge(graph, first[key], split)
            merged += 1
        return merged
