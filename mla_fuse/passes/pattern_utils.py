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

Cost. Tracing a pattern takes ~0.3 s (``make_fx`` with Inductor's decompositions),
and each pattern is traced again, with the matched shapes, for every candidate
match. So only the rope forms and styles the graph shows are registered
(``rope_forms.present``), traced patterns are kept for the process
(``register_cached``, keyed by everything the pattern depends on), and the
binding checks that need no shapes run before the re-trace.

Dynamic token counts. The re-traced pattern takes each distinct symbolic size
as one input, but a graph compiled with a dynamic token count may hold several
nodes for the same size (dynamo makes one placeholder per input whose size it
is: the hidden states' and the positions'; Inductor adds ``sym_size`` calls), and
a rope that reads ``x.size(0)`` in one place and ``positions.size(0)`` in another
uses two of them. ``unify_symbolic_sizes`` first points every use of a size at
the first node holding it, so one pattern input binds them all.
"""

from __future__ import annotations

import abc
from typing import Callable

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._dynamo.utils import dynamo_timed
from torch._inductor.fx_passes.post_grad import remove_noop_ops, view_to_reshape
from torch._subclasses.fake_tensor import FakeTensorMode

from mla_fuse.passes.aliasing import foreign_readers, parent
from mla_fuse.passes.config import ALL_KV_CACHE_DTYPES, FusionConfig
from mla_fuse.passes.inductor_pass import MlaFusePass


# Inductor's compile timers (``torch._dynamo.utils.compilation_time_metrics``, seconds per call).
SETUP_TIMER = "mla_fuse.pattern_setup"  # tracing and registering patterns
MATCH_TIMER = "mla_fuse.pattern_match"  # matching and replacing


def trace_pattern(*args, **kwargs) -> fx.GraphModule:
    """``fwd_only``, then ``canonicalize``."""
    gm = pm.fwd_only(*args, **kwargs)
    canonicalize(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def canonicalize(gm: fx.GraphModule) -> None:
    """The form Inductor's post-grad graphs have when the custom pass sees them: Inductor's joint-graph
    rewrites, views as reshapes, no-op ops removed (a rope's ``x.view(T, -1, R)`` of a ``[T, H, R]`` q
    is gone from the graph, but not from ``[T, R]`` k: a pattern that kept it could only match q's
    chain on k's nodes)."""
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes

    joint_graph_passes(gm)
    view_to_reshape(gm)
    remove_noop_ops(gm.graph)


def fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=False)


def table_dtypes(graph: fx.Graph) -> set[torch.dtype]:
    """dtypes of the cos/sin tables the graph's ropes index (``fp32`` when none is seen)."""
    dtypes = {node.args[0].meta["val"].dtype for node in table_lookups(graph)}
    for node in graph.find_nodes(op="call_function", target=torch.ops.higher_order.auto_functionalized):
        table = node.kwargs.get("cos_sin_cache")
        if isinstance(table, fx.Node) and "val" in table.meta:
            dtypes.add(table.meta["val"].dtype)
    return dtypes or {torch.float32}


def no_foreign_readers(match: pm.Match, mutated_names: tuple[str, ...]) -> bool:
    """The pre-rotation inputs (and the buffers they view) are read by nothing but the match."""
    allowed = set(match.nodes)
    new_values = {node for node in match.output_nodes() if node is not None}
    for name in mutated_names:
        node = match.kwargs.get(name)
        if not isinstance(node, fx.Node) or foreign_readers(node, allowed, new_values):
            return False
    return True



def unify_symbolic_sizes(graph: fx.Graph) -> int:
    """Point every use of a node whose value is a symbolic size at the first node with the same
    size (the graph holds one per dynamic input, plus ``sym_size`` calls). Returns the rewrites."""
    first: dict = {}
    rewritten = 0
    for node in graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt):
            continue
        expr = val.node.expr
        if expr not in first:
            first[expr] = node
        elif node.users:
            node.replace_all_uses_with(first[expr])
            rewritten += 1
    return rewritten


def inputs_distinct(match: pm.Match, names: tuple[str, ...]) -> bool:
    """The named tensor inputs are bound to distinct nodes, none a view of another (q's rope chain
    matched on k's starts at a reshape of k)."""
    nodes = [match.kwargs.get(name) for name in names]
    if not all(isinstance(node, fx.Node) and "val" in node.meta for node in nodes):
        return False
    chains = [_view_chain(node) for node in nodes]
    return not any(a is not b and a_node in b for a, a_node in zip(chains, nodes) for b in chains)


def binding_is_sound(match: pm.Match, ranks: dict[str, int], widths: dict[str, int]) -> bool:
    """``inputs_distinct``, of the expected ranks and last-dim widths, and the replacement would not
    close a cycle (an input computed from a user of the match's outputs: q of another layer bound
    to this layer's pattern)."""
    if not inputs_distinct(match, tuple(ranks)):
        return False
    for name in ranks:
        val = match.kwargs[name].meta["val"]
        if val.dim() != ranks[name] or (name in widths and val.size(-1) != widths[name]):
            return False
    return not _inputs_downstream_of_outputs(match)


def _view_chain(node: fx.Node) -> set[fx.Node]:
    """``node`` and every tensor it is a view of."""
    chain = {node}
    while (node := parent(node)) is not None:
        chain.add(node)
    return chain


def _inputs_downstream_of_outputs(match: pm.Match) -> bool:
    inputs = {node for node in match.kwargs.values() if isinstance(node, fx.Node)}
    matched = set(match.nodes)
    frontier = [user for out in match.output_nodes() if out is not None for user in out.users if user not in matched]
    seen: set[fx.Node] = set()
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        if node in inputs:
            return True
        seen.add(node)
        frontier.extend(node.users)
    return False


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


def table_lookups(graph: fx.Graph) -> list[fx.Node]:
    """``index``/``index_select`` of a 2-D tensor: where a native rope reads its cos/sin rows."""
    return [node for target in (torch.ops.aten.index.Tensor, torch.ops.aten.index_select.default)
            for node in graph.find_nodes(op="call_function", target=target)
            if isinstance(node.args[0], fx.Node) and node.args[0].meta.get("val") is not None
            and node.args[0].meta["val"].dim() == 2]


_TRACED: dict[tuple, list[pm.PatternEntry]] = {}


def clear_pattern_cache() -> None:
    """Forget the traced patterns (a changed pattern class must be traced again)."""
    _TRACED.clear()


def register_cached(pattern, key: tuple, patterns: pm.PatternMatcherPass,
                    precheck: Callable[[pm.Match], bool]) -> None:
    """Register ``pattern`` (``.pattern``/``.replacement``/``.example_inputs()``/``.extra_check``/``.name``)
    into ``patterns``, tracing it only the first time ``key`` is seen in this process. ``precheck`` runs
    on the structural match, before torch re-traces the pattern with the matched shapes."""
    key = (*key, torch._inductor.config.emulate_precision_casts)  # it changes Inductor's canonical form
    entries = _TRACED.get(key)
    if entries is None:
        scratch = pm.PatternMatcherPass()
        with fake_mode():
            pm.register_replacement(pattern.pattern, pattern.replacement, pattern.example_inputs(), trace_pattern,
                                    scratch, extra_check=pattern.extra_check, pattern_name=pattern.name)
        entries = [entry for listed in scratch.patterns.values() for entry in listed]
        for entry in entries:
            entry.extra_check = _checked_first(precheck, entry.extra_check)
        _TRACED[key] = entries
    for entry in entries:
        entry.register(patterns)


def _checked_first(precheck, check):
    def extra_check(match: pm.Match) -> bool:
        return precheck(match) and check(match)
    return extra_check


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

    def fusable(self, kv_cache_dtype: str | None) -> bool:
        """A cache format in ``fusable_kv_cache_dtypes``; an unknown one (``None``: the op was called
        without it) only when every format is."""
        if kv_cache_dtype is None:
            return set(ALL_KV_CACHE_DTYPES) <= set(self.config.fusable_kv_cache_dtypes)
        return kv_cache_dtype in self.config.fusable_kv_cache_dtypes

    @abc.abstractmethod
    def enabled(self) -> bool:
        """The config flag of this fusion."""

    @abc.abstractmethod
    def _register_for(self, graph: fx.Graph) -> None:
        """Register the patterns this graph's cache updates need (through ``register``)."""

    def register(self, pattern, key: tuple) -> None:
        """``pattern`` into this pass, once per ``key`` (traced once per process)."""
        key = (type(pattern).__name__, *key)
        if key not in self._registered:
            self._registered.add(key)
            register_cached(pattern, key, self.patterns, pattern.precheck)

    def run(self, graph: fx.Graph) -> int:
        if not self.enabled():
            return 0
        unify_symbolic_sizes(graph)
        with dynamo_timed(SETUP_TIMER):
            self._register_for(graph)
        with dynamo_timed(MATCH_TIMER):
            return self.patterns.apply(graph)
