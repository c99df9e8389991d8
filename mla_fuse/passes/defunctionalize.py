"""DefunctionalizationPass: fused ``auto_functionalized`` nodes -> in-place calls (CONTRACT §6).

Inductor would otherwise decompose each ``auto_functionalized`` node into
``clone`` + in-place op + copies whenever it cannot prove the in-place write
safe, which for views such as ``q[..., nope:]`` means a copy of q_pe and a
``slice_scatter`` back into q. This pass writes the fused op's inputs in
place, points the users of its outputs at the mutated inputs, and deletes the
write-backs that become identities, so the kernel writes q directly.
"""

from __future__ import annotations

import torch
from torch import fx

from mla_fuse.layers import unified_ops
from mla_fuse.passes import aliasing
from mla_fuse.passes.fx_utils import find_auto_functionalized, getitem_users, is_op, mutated_arg_names, num_returns
from mla_fuse.passes.inductor_pass import MlaFusePass, logger

aten = torch.ops.aten
FUSED_OPS = (unified_ops.FUSED_MLA_UPDATE, unified_ops.FUSED_UPDATE)


class DefunctionalizationPattern:
    """Matched graph and replacement, for each fused node ``f`` mutating ``x`` (a view ``x = base[region]``)::

        f = auto_functionalized(fused_op, x=x, ...)      f_out = fused_op(x=x, ...)   # writes x in place
        x_new = f[i]                                     # x_new -> x
        c = copy(dst, x_new)                             # c -> x            (write-back)
        y = slice_scatter(base', x_new, region)          # y -> base'        (base' ~ base, write-back)
        copy_(input, f[j])                               # copy_(input, input) -> deleted
        dummy = f[0]                                     # dummy -> f_out

    Done only when the write is safe: nothing after ``f`` reads the old contents of ``x``
    or of the buffers it views, and a mutated graph input is one the program mutates
    anyway (it ends with ``copy_(input, f[j])``). Otherwise ``f`` stays functional.
    """

    def __init__(self, graph: fx.Graph, node: fx.Node) -> None:
        self.graph, self.node = graph, node
        self.op = node.args[0]
        self.outputs = getitem_users(node)
        self.mutated = {name: node.kwargs[name] for name in mutated_arg_names(self.op)}
        self.new_value = {
            name: self.outputs.get(num_returns(self.op) + i, []) for i, name in enumerate(self.mutated)
        }

    def safe(self) -> bool:
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        new_values = {item for items in self.outputs.values() for item in items}
        for name, arg in self.mutated.items():
            if not isinstance(arg, fx.Node):
                return False
            base = aliasing.root(arg)
            if base.op == "placeholder" and not self._input_mutated_by_program(base, name):
                return False
            if any(order[reader] > order[self.node]
                   for reader in aliasing.foreign_readers(arg, {self.node}, new_values)):
                return False
            if arg is not base and not _aliases(arg, base):
                return False
        return True

    def _input_mutated_by_program(self, base: fx.Node, name: str) -> bool:
        return self.mutated[name] is base and any(
            is_op(user, aten.copy_.default) and user.args[0] is base and user.args[1] in self.new_value[name]
            for user in base.users)

    def insertion_point(self) -> fx.Node:
        """Where the in-place call goes: where the functional node is (its inputs exist there)."""
        return self.node

    def rewrite(self) -> None:
        with self.graph.inserting_before(self.insertion_point()):
            call = self.graph.call_function(self.op, kwargs=dict(self.node.kwargs))
        call.meta.update({k: v for k, v in self.node.meta.items() if k != "eager_input_vals"})
        if "eager_input_vals" in self.node.meta:  # (args, kwargs) of the call, minus the op argument
            call.meta["eager_input_vals"] = ((), self.node.meta["eager_input_vals"][1])
        call.meta["val"] = self.node.meta["val"][0] if "val" in self.node.meta else None
        for item in self.outputs.get(0, []):
            item.replace_all_uses_with(call)
            self.graph.erase_node(item)
        for name, arg in self.mutated.items():
            for item in self.new_value[name]:
                self._drop_write_backs(item, arg)
                item.replace_all_uses_with(arg)
                self.graph.erase_node(item)
        for user in list(call.kwargs.values()):
            if isinstance(user, fx.Node) and user.op == "placeholder":
                for copy in [u for u in user.users if is_op(u, aten.copy_.default) and u.args == (user, user)]:
                    self.graph.erase_node(copy)
        self.graph.erase_node(self.node)

    def _drop_write_backs(self, new_value: fx.Node, arg: fx.Node) -> None:
        """Replace write-backs of ``new_value`` by what they become once ``arg`` holds it in place."""
        for user in list(new_value.users):
            if aliasing.same_shape_reshape(user) or (
                    is_op(user, aten.copy.default) and user.meta["val"].shape == new_value.meta["val"].shape
                    and user.args[1] is new_value):
                self._drop_write_backs(user, arg)
                user.replace_all_uses_with(new_value)
                self.graph.erase_node(user)
            elif is_op(user, aten.slice_scatter.default) and aliasing.is_write_back(user, arg, {new_value}):
                user.replace_all_uses_with(user.args[0])
                self.graph.erase_node(user)


def _aliases(view: fx.Node, base: fx.Node) -> bool:
    """Whether the fake values say ``view`` shares ``base``'s storage (unknown: False)."""
    view_val, base_val = view.meta.get("val"), base.meta.get("val")
    if view_val is None or base_val is None:
        return False
    return view_val.untyped_storage()._cdata == base_val.untyped_storage()._cdata or torch._C._is_alias_of(
        view_val, base_val)


class DefunctionalizationPass(MlaFusePass):
    """Applies ``DefunctionalizationPattern`` to every fused node; counts those rewritten."""

    name = "defunctionalization"

    def __init__(self, ops=None) -> None:
        super().__init__()
        self.ops = ops  # None: this module's FUSED_OPS, read when the pass runs
        self.kept_functional = 0

    def run(self, graph: fx.Graph) -> int:
        rewritten, self.kept_functional = 0, 0
        for op in self.ops if self.ops is not None else FUSED_OPS:
            for node in find_auto_functionalized(graph, op):
                pattern = DefunctionalizationPattern(graph, node)
                if pattern.safe():
                    pattern.rewrite()
                    rewritten += 1
                else:
                    self.kept_functional += 1
                    logger.warning("defunctionalization: %s left functional (an in-place write would be "
                                   "observed by a later reader)", node.format_node())
        return rewritten
