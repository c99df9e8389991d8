"""Shared machinery of the two RoPE + KV-cache fusion passes.

Patterns are registered lazily, per graph: the pass reads the cache-update
nodes present (their layer name and ``kv_cache_dtype`` are string literals in
the graph, so each layer gets its own patterns, as in vLLM) and traces one
pattern per (layer, rope form, style) it has not registered yet, under a fake
mode with example shapes taken from the update node. Integers in the traced
pattern are wildcards for the first match only; torch's ``register_replacement``
then re-traces the pattern with the matched shapes (symbolic ones included)
and requires an exact match, so head sizes, slice bounds and ``is_neox`` are
checked literally.
"""

from __future__ import annotations

import abc

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._inductor.fx_passes.post_grad import view_to_reshape
from torch._subclasses.fake_tensor import FakeTensorMode

from mla_fuse.passes.aliasing import foreign_readers
from mla_fuse.passes.config import FusionConfig
from mla_fuse.passes.inductor_pass import MlaFusePass


def trace_pattern(*args, **kwargs) -> fx.GraphModule:
    """``fwd_only`` then view -> reshape, the form Inductor's post-grad graphs have."""
    gm = pm.fwd_only(*args, **kwargs)
    view_to_reshape(gm)
    return gm


def fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=False)


def table_dtypes(graph: fx.Graph) -> set[torch.dtype]:
    """dtypes of the cos/sin tables the graph's ropes index (``fp32`` when none is seen)."""
    dtypes = set()
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.index.Tensor):
        val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if val is not None and val.dim() == 2:
            dtypes.add(val.dtype)
    for node in graph.find_nodes(op="call_function", target=torch.ops.aten.index_select.default):
        val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if val is not None and val.dim() == 2:
            dtypes.add(val.dtype)
    for node in graph.find_nodes(op="call_function", target=torch.ops.higher_order.auto_functionalized):
        table = node.kwargs.get("cos_sin_cache")
        if isinstance(table, fx.Node) and "val" in table.meta:
            dtypes.add(table.meta["val"].dtype)
    return dtypes or {torch.float32}


def innermost_contiguous(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return val is not None and (val.dim() == 0 or val.size(-1) == 1 or val.stride(-1) == 1)


def no_foreign_readers(match: pm.Match, mutated_names: tuple[str, ...]) -> bool:
    """The pre-rotation inputs (and the buffers they view) are read by nothing but the match."""
    allowed = set(match.nodes)
    new_values = {node for node in match.output_nodes() if node is not None}
    for name in mutated_names:
        node = match.kwargs.get(name)
        if not isinstance(node, fx.Node) or foreign_readers(node, allowed, new_values):
            return False
    return True



def hint(size) -> int:
    """A concrete value for a possibly symbolic size (example shapes only; never guarded on)."""
    return size.node.hint if isinstance(size, torch.SymInt) else int(size)


class LazyPatternFusionPass(MlaFusePass):
    """A fusion whose patterns are registered per graph, for the geometries its cache updates show
    (head sizes, rotary widths, cache formats), then applied; each key is registered once."""

    def __init__(self, config: FusionConfig | None = None) -> None:
        super().__init__()
        self.config = config or FusionConfig()
        self.patterns = pm.PatternMatcherPass(pass_name=self.name)
        self._registered: set[tuple] = set()

    @abc.abstractmethod
    def enabled(self) -> bool:
        """The config flag of this fusion."""

    @abc.abstractmethod
    def _register_for(self, graph: fx.Graph) -> None:
        """Register the patterns this graph's cache updates need."""

    def run(self, graph: fx.Graph) -> int:
        if not self.enabled():
            return 0
        self._register_for(graph)
        return self.patterns.apply(graph)
