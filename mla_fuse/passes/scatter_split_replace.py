"""ScatterSplitReplacementPass: read the rotary op's outputs directly instead of
re-splitting the buffer they were scattered back into (CONTRACT §6).

When an in-place op mutates ``getitem``s of a ``split_with_sizes`` (q and k of a
packed qkv; k_pe of MLA's ``[kv_c | k_pe]`` projection), functionalization
writes each new value back into the split buffer with ``slice_scatter`` and
re-splits the result for every later use. This pass points the re-split's users
at the op's outputs (the other parts at the first split) and deletes the
scatters and the re-split, so the rope output feeds the cache update directly
and the fusion patterns see ``rope -> update``.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from mla_fuse.passes.fx_utils import (
    erase_if_unused, find_auto_functionalized, getitem_users, is_op, mutated_arg_names, normalize_dim, num_returns,
)
from mla_fuse.passes.inductor_pass import MlaFusePass

aten = torch.ops.aten
SPLIT = aten.split_with_sizes.default
SLICE_SCATTER = aten.slice_scatter.default
SLICE = aten.slice.Tensor


class ScatterSplitReplacementPattern:
    """Matched graph and replacement (``sizes = [a, b, c]``, offsets ``o_i``)::

        s = split_with_sizes(buf, sizes, d);  q = s[0];  k = s[1];  v = s[2]
        r = auto_functionalized(rotary_embedding, query=q, key=k, ...)
        s1 = slice_scatter(buf, r[1], d, o_0, o_1)          # write-backs, any order,
        s2 = slice_scatter(s1, r[2], d, o_1, o_2)           #   each used only by the next
        t = split_with_sizes(s2, sizes, d)                  # the only user of the last scatter
        use(t[0], t[1], t[2])
        -->
        s = split_with_sizes(buf, sizes, d);  q = s[0];  k = s[1];  v = s[2]
        r = auto_functionalized(rotary_embedding, query=q, key=k, ...)
        use(r[1], r[2], v)

    torch 2.15's functionalization re-reads the scattered buffer with ``slice(s2, d, o_i, o_(i+1))``
    per part instead of one re-split (several slices of a part included): those are rewritten the
    same way, if every reader of the last scatter is such a slice of exactly one part.
    """

    def __init__(self, graph: Graph, mutating: Node) -> None:
        self.graph = graph
        self.mutating = mutating
        op = mutating.args[0]
        self.output_index = {name: num_returns(op) + i for i, name in enumerate(mutated_arg_names(op))}

    def rewrite(self) -> int:
        """Rewrite every split whose parts this op mutates; returns how many."""
        by_split: dict[Node, dict[int, Node]] = {}
        items = getitem_users(self.mutating)
        for name, out_index in self.output_index.items():
            arg = self.mutating.kwargs.get(name)
            if is_op(arg, operator.getitem) and is_op(arg.args[0], SPLIT) and out_index in items:
                by_split.setdefault(arg.args[0], {})[arg.args[1]] = items[out_index][0]
        return sum(self._rewrite_split(split, new_parts) for split, new_parts in by_split.items())

    def _rewrite_split(self, split: Node, new_parts: dict[int, Node]) -> bool:
        buf, sizes = split.args[0], list(split.args[1])
        dim = normalize_dim(split.args[2] if len(split.args) > 2 else 0, buf)
        offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        expected = {new: (offsets[i], offsets[i + 1]) for i, new in new_parts.items()}

        # Walk the scatter chain from buf: each link writes one new part at its offsets.
        chain, current = [], buf
        while expected:
            links = [u for u in current.users if is_op(u, SLICE_SCATTER) and u.args[0] is current]
            if len(links) != 1 or (current is not buf and len(current.users) != 1):
                return False
            link = links[0]
            src, link_dim, start, end = link.args[1], normalize_dim(link.args[2], link), link.args[3], link.args[4]
            if link_dim != dim or expected.pop(src, None) != (start, end) or len(link.args) > 5 and link.args[5] != 1:
                return False
            chain.append(link)
            current = link
        rereads = self._rereads(current, sizes, dim, offsets)
        if rereads is None:
            return False
        readers, resplit = rereads

        old_parts = getitem_users(split)
        for index, items in readers.items():
            replacement = new_parts.get(index)
            if replacement is None:
                if index not in old_parts:
                    with self.graph.inserting_after(split):
                        old_parts[index] = [self.graph.call_function(operator.getitem, (split, index))]
                        old_parts[index][0].meta.update(items[0].meta)
                replacement = old_parts[index][0]
            for item in items:
                item.replace_all_uses_with(replacement)
        erase_if_unused(self.graph, [item for items in readers.values() for item in items])
        if resplit is not None:
            self.graph.erase_node(resplit)
        erase_if_unused(self.graph, reversed(chain))
        return True

    def _rereads(self, scattered: Node, sizes: list[int], dim: int,
                 offsets: list[int]) -> tuple[dict[int, list[Node]], Node | None] | None:
        """The part re-reads of the fully scattered buffer, ``({part index: [nodes]}, re-split or None)``:
        the ``getitem``s of its sole re-split (same sizes and dim), or else (torch 2.15) its readers, if
        each is a ``slice`` along ``dim`` of exactly one part. ``None`` when anything else reads it."""
        resplit = self.sole_resplit(scattered)
        if resplit is not None:
            if any(not is_op(user, operator.getitem) for user in resplit.users):
                return None
            if list(resplit.args[1]) != sizes or normalize_dim(resplit.args[2] if len(resplit.args) > 2 else 0,
                                                              scattered) != dim:
                return None
            return getitem_users(resplit), resplit
        parts = {(offsets[i], offsets[i + 1]): i for i in range(len(sizes))}
        readers: dict[int, list[Node]] = {}
        for user in scattered.users:
            index = parts.get(_slice_bounds(user, scattered, dim))
            if index is None:
                return None
            readers.setdefault(index, []).append(user)
        return (readers, None) if readers else None


    @staticmethod
    def sole_resplit(scattered: Node) -> Node | None:
        """The re-split of the fully scattered buffer, if it is the buffer's only user (another reader
        sees the scattered values, which the rewrite would take away from it)."""
        users = list(scattered.users)
        return users[0] if len(users) == 1 and is_op(users[0], SPLIT) else None


def _slice_bounds(node: Node, base: Node, dim: int) -> tuple[int, int] | None:
    """``(start, end)`` of ``node`` if it is ``slice(base, dim, start, end)`` with unit step (bounds
    clamped to the size, as ``slice`` clamps them), else ``None``."""
    if not is_op(node, SLICE) or node.args[0] is not base:
        return None
    values = dict(zip(("dim", "start", "end", "step"), node.args[1:]), **node.kwargs)
    size = base.meta["val"].size(dim)
    start, end = values.get("start"), values.get("end")
    start, end = 0 if start is None else start, size if end is None else end
    if not all(isinstance(v, int) for v in (start, end, size)) or values.get("step", 1) != 1:
        return None
    if normalize_dim(values.get("dim", 0), base) != dim:
        return None
    start, end = (v + size if v < 0 else v for v in (start, end))
    return min(max(start, 0), size), min(max(end, 0), size)


class ScatterSplitReplacementPass(MlaFusePass):
    """Applies ``ScatterSplitReplacementPattern`` to every ``rotary_embedding`` node."""

    name = "scatter_split_replacement"

    def __init__(self, ops=None) -> None:
        super().__init__()
        self.ops = ops

    def _ops(self):
        return self.ops if self.ops is not None else (torch.ops.mla_fuse.rotary_embedding.default,)

    def run(self, graph: Graph) -> int:
        return sum(
            ScatterSplitReplacementPattern(graph, node).rewrite()
            for op in self._ops()
            for node in find_auto_functionalized(graph, op)
        )
