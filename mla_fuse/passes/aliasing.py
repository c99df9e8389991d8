"""Who reads a tensor before an in-place op overwrites it.

A fused op that writes ``q_pe``, ``k_pe`` (views into the q and latent
projections) or a cache in place is only correct if nothing reads the old
values afterwards. In the functional graph the old values are the op's inputs
and the buffers they are views of; the new values are its outputs. This module
finds the *foreign readers* of the old values: users of the mutated tensor or
of any buffer it is a view of, excluding

* the nodes the caller allows (the matched pattern, the fused node),
* disjoint siblings (``kv_c = split(latent)[0]`` beside ``k_pe = split(latent)[1]``;
  ``q[..., :nope]`` beside ``q[..., nope:]``),
* write-backs of the new value into the same region
  (``slice_scatter(base, new, d, s, e)``, ``copy(dst, new)``, ``copy_(input, new)``).

Fusion refuses a match with foreign readers; defunctionalization refuses to
write in place when one runs after the op.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from mla_fuse.passes.fx_utils import VIEW_OPS, is_op, normalize_dim

aten = torch.ops.aten
_END = 2**63 - 1


def parent(node: Node) -> Node | None:
    """The tensor ``node`` is a view of (a split's parts have the split as parent), else None."""
    if is_op(node, operator.getitem) and is_op(node.args[0], aten.split_with_sizes.default, aten.split.Tensor):
        return node.args[0]
    if is_op(node, *VIEW_OPS):
        return node.args[0]
    return None


def region_base(node: Node) -> Node | None:
    """The tensor whose ``region(node)`` ``node`` is (a slice's input, a split part's split input)."""
    if is_op(node, aten.slice.Tensor):
        return node.args[0]
    if is_op(node, operator.getitem) and is_op(node.args[0], aten.split_with_sizes.default):
        return node.args[0].args[0]
    return None


def _slice_bounds(size, dim_arg, start, end, step) -> tuple[int, int, int] | None:
    """Normalized ``(dim, start, end)`` of a unit-step slice of a static-size dim."""
    if step != 1 or not isinstance(size, int):
        return None
    start = 0 if start is None else start
    end = _END if end is None else end
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    start = max(start + size if start < 0 else start, 0)
    end = min(end + size if end < 0 else end, size)
    return dim_arg, start, end


def _slice_args(node: Node, tensor_args: int) -> tuple:
    """``(dim, start, end, step)`` of a ``slice``/``slice_scatter`` node, defaults filled in."""
    rest = list(node.args[tensor_args:]) + [None] * 4
    dim = node.kwargs.get("dim", rest[0] if rest[0] is not None else 0)
    return dim, node.kwargs.get("start", rest[1]), node.kwargs.get("end", rest[2]), \
        node.kwargs.get("step", rest[3] if rest[3] is not None else 1)


def region(node: Node) -> tuple[int, int, int] | None:
    """``(dim, start, end)`` of ``node`` inside its parent for unit-step slices and split parts."""
    if is_op(node, aten.slice.Tensor):
        base = node.args[0]
        dim, start, end, step = _slice_args(node, 1)
        dim = normalize_dim(dim, base)
        return _slice_bounds(base.meta["val"].size(dim), dim, start, end, step)
    if is_op(node, operator.getitem) and is_op(node.args[0], aten.split_with_sizes.default):
        split = node.args[0]
        sizes = list(split.args[1])
        if not all(isinstance(s, int) for s in sizes):
            return None
        dim = normalize_dim(split.args[2] if len(split.args) > 2 else 0, split.args[0])
        return dim, sum(sizes[: node.args[1]]), sum(sizes[: node.args[1] + 1])
    return None


def same_view(a: Node, b: Node) -> bool:
    """``a`` and ``b`` are the same tensor or equal-shape views of one tensor (same storage layout)."""
    if a is b:
        return True
    return (is_op(a, *_RESHAPES) and is_op(b, *_RESHAPES) and a.args[0] is b.args[0]
            and a.meta.get("val") is not None and b.meta.get("val") is not None
            and a.meta["val"].shape == b.meta["val"].shape and a.meta["val"].stride() == b.meta["val"].stride())


_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


def same_shape_reshape(node: object) -> bool:
    """A reshape whose result has its input's shape (the same value)."""
    return (is_op(node, *_RESHAPES) and "val" in node.meta and "val" in node.args[0].meta
            and node.meta["val"].shape == node.args[0].meta["val"].shape)


def is_new_value(node: object, new_values: set[Node]) -> bool:
    """``node`` is one of ``new_values``, possibly through same-shape reshapes or value copies."""
    while node not in new_values:
        if same_shape_reshape(node):
            node = node.args[0]
        elif is_op(node, aten.copy.default) and "val" in node.meta and \
                node.meta["val"].shape == node.args[1].meta["val"].shape:
            node = node.args[1]
        else:
            return False
    return True


def is_write_back(user: Node, mutated: Node, new_values: set[Node]) -> bool:
    """``user`` writes a new value back over the region ``mutated`` occupies (reads nothing old there)."""
    if is_op(user, aten.copy.default, aten.copy_.default) and is_new_value(user.args[1], new_values):
        return True  # copy(dst, new): dst is only read for its metadata; copy_(input, new): the epilogue
    if is_op(user, aten.slice_scatter.default) and is_new_value(user.args[1], new_values):
        target = user.args[0]
        mutated_parent, mutated_region = region_base(mutated), region(mutated)
        if mutated_parent is None or mutated_region is None or not same_view(target, mutated_parent):
            return False
        dim, start, end, step = _slice_args(user, 2)
        dim = normalize_dim(dim, target)
        return _slice_bounds(target.meta["val"].size(dim), dim, start, end, step) == mutated_region
    return False


def _disjoint(a: Node, b: Node) -> bool:
    region_a, region_b = region(a), region(b)
    if region_a is None or region_b is None or region_a[0] != region_b[0]:
        return False
    return region_a[2] <= region_b[1] or region_b[2] <= region_a[1]


def foreign_readers(mutated: Node, allowed: set[Node], new_values: set[Node]) -> list[Node]:
    """Nodes outside ``allowed`` that may read the old contents of ``mutated``'s memory."""
    readers: list[Node] = []
    child, current = None, mutated
    while current is not None:
        for user in current.users:
            if user is child or user in allowed or (child is not None and _disjoint(user, child)):
                continue
            readers.extend(_readers_through_views(user, mutated, allowed, new_values))
        child, current = current, parent(current)
    return readers


def _readers_through_views(node: Node, mutated: Node, allowed: set[Node], new_values: set[Node]) -> list[Node]:
    if node in allowed or is_write_back(node, mutated, new_values):
        return []
    if is_op(node, aten.split_with_sizes.default, aten.split.Tensor, operator.getitem) or (
            is_op(node, *VIEW_OPS) and node.target is not aten.expand.default):
        # A view of the old memory: its users read it.
        return [r for user in node.users for r in _readers_through_views(user, mutated, allowed, new_values)]
    return [node]


def root(node: Node) -> Node:
    """The tensor at the bottom of ``node``'s view chain."""
    while (up := parent(node)) is not None:
        node = up
    return node
