"""Shared machinery of the two RoPE + KV-cache fusion passes.

Patterns are registered lazily, per graph, once per *form*: the pass reads the cache-update
nodes present and traces one pattern per (rope form, style, cache format, geometry) it has not
registered yet, under a fake mode with example shapes taken from the update node. The layer
name is not part of a pattern: it is the pattern function's last argument, traced as a
sentinel string and turned into a wildcard (``KeywordArg("layer_name")``) in the traced
pattern, so the match binds the layer's own name and hands it to the replacement. A model of
61 layers of one shape registers what a model of 1 layer registers (docs/STARTUP.md; vLLM registers
one pattern per layer name, and so did this project: set-up grew with depth, and every layer's
pattern was tried against every layer's rope nodes, so matching grew with its square).

Which update belongs to which rotated q. The pattern reads the cos/sin rows once for q and k, so
a match binds the update whose k chain reads the very rows the matched q chain read: its own
layer's (each layer's rope looks its rows up itself, also when layers share one rope module).
``binding_is_sound`` still refuses any binding that would close a cycle.

Integers in the traced pattern are wildcards for the first match only; torch's
``register_replacement`` then re-traces the pattern with the matched shapes (symbolic ones
included) and the matched layer name, and requires an exact match, so head sizes, slice
bounds, ``is_neox`` and the layer are checked literally.

Cost (docs/STARTUP.md has the figures). Tracing a pattern is slow (``make_fx`` with Inductor's
decompositions). So only the rope forms and styles the graph shows are registered
(``rope_forms.present``), traced patterns are kept for the process (``register_cached``, keyed by
everything the pattern depends on), and the binding checks that need no shapes run before the
re-trace. torch re-traces the search pattern with the matched shapes for every candidate match;
the layers of a model have the same shapes, so within one graph that trace is kept per (pattern,
matched shapes) and the next match gets a copy with its own layer name put in (``MatchTraces``;
``layer_wildcard``): one search trace per form and shape, not per layer. The replacement is still
traced per match (one op), so every fused node has its own fake values. A pass whose graph has
no update it could fuse registers nothing, runs no matcher and leaves the graph as it was.
Inductor's compile timers (``torch._dynamo.utils.compilation_time_metrics``) get the set-up
(``SETUP_TIMER``) and the matching (``MATCH_TIMER``).

Dynamic token counts. The re-traced pattern takes each distinct symbolic size as one input, but
a graph compiled with a dynamic token count may hold several nodes for the same size (dynamo
makes one placeholder per input whose size it is: the hidden states' and the positions';
Inductor adds ``sym_size`` calls), and a rope that reads ``x.size(0)`` in one place and
``positions.size(0)`` in another uses two of them. ``unify_symbolic_sizes`` first points every
use of a size at the first node holding it, so one pattern input binds them all (undone when
nothing matched).
"""

from __future__ import annotations

import abc
import contextlib
import inspect
from typing import Callable

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._dynamo.utils import dynamo_timed
from torch._inductor.fx_passes.joint_graph import joint_graph_passes, lazy_init
from torch._inductor.fx_passes.post_grad import remove_noop_ops, view_to_reshape
from torch._subclasses.fake_tensor import FakeTensorMode

from mla_fuse.passes.aliasing import foreign_readers, parent
from mla_fuse.passes.config import ALL_KV_CACHE_DTYPES, FusionConfig
from mla_fuse.passes.fx_utils import call_args
from mla_fuse.passes.graph_facts import CallForm, table_dtypes, table_lookups  # noqa: F401  (read as pattern_utils.*)
from mla_fuse.passes.inductor_pass import MlaFusePass
from mla_fuse.passes.layer_wildcard import LAYER_NAME_ARG, PATTERN_LAYER_NAME, copy_with_layer, layer_name_wildcard


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
    joint_graph_passes(gm)
    view_to_reshape(gm)
    remove_noop_ops(gm.graph)


def fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=False)


def no_foreign_readers(match: pm.Match, mutated_names: tuple[str, ...]) -> bool:
    """The pre-rotation inputs (and the buffers they view) are read by nothing but the match."""
    allowed = set(match.nodes)
    new_values = {node for node in match.output_nodes() if node is not None}
    for name in mutated_names:
        node = match.kwargs.get(name)
        if not isinstance(node, fx.Node) or foreign_readers(node, allowed, new_values):
            return False
    return True



def unify_symbolic_sizes(graph: fx.Graph) -> list[tuple[fx.Node, tuple, dict]]:
    """Point every use of a node whose value is a symbolic size at the first node with the same
    size (the graph holds one per dynamic input, plus ``sym_size`` calls). Returns each rewritten
    user with its arguments as they were (``restore_symbolic_sizes`` undoes the rewrites)."""
    first: dict = {}
    edits: list[tuple[fx.Node, tuple, dict]] = []
    for node in graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt):
            continue
        expr = val.node.expr
        if expr not in first:
            first[expr] = node
            continue
        for user in list(node.users):
            edits.append((user, user.args, dict(user.kwargs)))
            user.replace_input_with(node, first[expr])
    return edits


def restore_symbolic_sizes(edits) -> None:
    """Undo ``unify_symbolic_sizes`` (its users' arguments as they were), latest edit first."""
    for user, args, kwargs in reversed(edits or ()):
        user.args, user.kwargs = args, kwargs


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


_TRACED: dict[tuple, list[pm.PatternEntry]] = {}



def clear_pattern_cache() -> None:
    """Forget the traced patterns (a changed pattern class must be traced again)."""
    _TRACED.clear()


def traced_pattern_count() -> int:
    """How many patterns this process has traced since the last ``clear_pattern_cache``."""
    return len(_TRACED)


class MatchTraces:
    """The search pattern as torch's ``register_replacement`` re-traces it to check a match exactly,
    kept per (pattern, matched shapes) while one graph is matched (``with MatchTraces.scope():``).
    The re-trace's inputs are the matched values: tensors (described in full by size, stride,
    dtype, device: torch re-creates them with ``empty_strided``), symbolic sizes, and the layer name
    last. Two matches whose inputs agree but for the layer name get the same graph up to that name,
    so the second gets a copy of the first's with its name put in, and the exact re-check (layer
    name included) still runs on it. Outside a scope (registration) every call traces."""

    _active: dict | None = None
    hits = misses = 0  # process-wide counts (tests count traces, not seconds)

    @classmethod
    @contextlib.contextmanager
    def scope(cls):
        outer, cls._active = cls._active, {}
        try:
            yield
        finally:
            cls._active = outer

    @classmethod
    def trace(cls, owner: object, fn, args, **kwargs) -> fx.GraphModule:
        memo, layer = cls._active, args[-1] if args else None
        if memo is None or not isinstance(layer, str):
            return trace_pattern(fn, args, **kwargs)
        key = (id(owner), tuple(_value_key(arg) for arg in args[:-1]))
        cached = memo.get(key)
        if cached is None:
            cls.misses += 1
            gm = trace_pattern(fn, args, **kwargs)
            memo[key] = (owner, gm, layer)  # owner kept alive: its id stays unique
            return copy_with_layer(gm, layer, layer)
        cls.hits += 1
        _, gm, traced_layer = cached
        return copy_with_layer(gm, traced_layer, layer)


def _value_key(value) -> tuple:
    """What a re-trace depends on in one input (symbolic sizes by expression)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(map(_size_key, value.size())), tuple(map(_size_key, value.stride())),
                value.dtype, value.device, value.requires_grad)
    if isinstance(value, torch.SymInt):
        return ("sym", value.node.expr)
    return ("value", type(value), value)


def _size_key(size):
    return size.node.expr if isinstance(size, torch.SymInt) else size


# torch 2.13 added ``register_replacement(..., pattern_name=)`` (a label for Inductor's per-pattern
# telemetry, nothing else); torch 2.11 and 2.12 reject the keyword. Read torch's signature once.
_ACCEPTS_PATTERN_NAME = "pattern_name" in inspect.signature(pm.register_replacement).parameters


def _init_inductor_patterns() -> None:
    """Register Inductor's own joint-graph patterns now, not from inside our ``register_replacement``.
    ``canonicalize`` runs Inductor's joint-graph passes on each traced pattern, and their first run
    for an input device (``joint_graph.lazy_init``, cached per device) registers Inductor's patterns
    through ``gen_pattern_and_search_gm``, whose ``functorch_config.patch`` decorator torch 2.11 and
    2.12 refuse to enter twice ("prior should be empty when entering ConfigPatch"). Inductor calls
    it with the graph's device; ``canonicalize`` with none, so on real Inductor the first pattern
    trace was that nested first run."""
    lazy_init()


def _pattern_name_option(name: str) -> dict[str, str]:
    """``{"pattern_name": name}`` where this torch's ``register_replacement`` takes it, else nothing."""
    return {"pattern_name": name} if _ACCEPTS_PATTERN_NAME else {}


def _plain(method, argnames: list[str]):
    """``method`` as a function with its signature (torch wraps bound methods in a fresh function;
    a function of ours lets ``MatchTraces`` tell the replacement from the search pattern)."""
    def function(*args):
        return method(*args)
    function.__signature__ = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in argnames])
    function.__name__ = method.__name__
    return function


def register_cached(pattern, key: tuple, patterns: pm.PatternMatcherPass,
                    precheck: Callable[[pm.Match], bool]) -> None:
    """Register ``pattern`` (``.pattern``/``.replacement``/``.example_inputs()``/``.extra_check``/``.name``;
    ``pattern`` and ``replacement`` take the tensors of ``example_inputs()`` then ``layer_name``) into
    ``patterns``, tracing it only the first time ``key`` is seen in this process. The traced layer
    name becomes a wildcard bound by the match. ``precheck`` runs on the structural match, before torch
    re-traces the pattern with the matched shapes and layer name."""
    key = (*key, torch._inductor.config.emulate_precision_casts)  # it changes Inductor's canonical form
    entries = _TRACED.get(key)
    if entries is None:
        scratch = pm.PatternMatcherPass()
        argnames = list(inspect.signature(pattern.pattern).parameters)
        search, replace = _plain(pattern.pattern, argnames), _plain(pattern.replacement, argnames)

        def trace_fn(fn, args, **kwargs):  # the search pattern's re-traces are kept per graph, not the replacement's
            if fn is replace:
                return trace_pattern(fn, args, **kwargs)
            return MatchTraces.trace(search, fn, args, **kwargs)

        _init_inductor_patterns()
        with fake_mode():
            pm.register_replacement(search, replace, [*pattern.example_inputs(), PATTERN_LAYER_NAME], trace_fn,
                                    scratch, extra_check=pattern.extra_check, **_pattern_name_option(pattern.name))
        entries = [entry for listed in scratch.patterns.values() for entry in listed]
        for entry in entries:
            entry.pattern = layer_name_wildcard(entry.pattern, pm.KeywordArg(LAYER_NAME_ARG))
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
    (head sizes, rotary widths, cache formats; not the layer names), then applied; each key is
    registered once. Subclasses set ``update_op``."""

    update_op = None

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
    def _register_for(self, graph: fx.Graph, updates: list[fx.Node]) -> None:
        """Register the patterns ``updates`` (this graph's fusable cache updates) need (through ``register``)."""

    def register(self, pattern, key: tuple) -> None:
        """``pattern`` into this pass, once per ``key`` (traced once per process)."""
        key = (type(pattern).__name__, *key)
        if key not in self._registered:
            self._registered.add(key)
            register_cached(pattern, key, self.patterns, pattern.precheck)

    @property
    def registered(self) -> int:
        """Patterns this pass has registered (one per form; never per layer)."""
        return len(self._registered)

    def fusable_updates(self, graph: fx.Graph) -> list[fx.Node]:
        """The graph's ``update_op`` calls with a cache format this pass may fuse."""
        return [node for node in graph.find_nodes(op="call_function", target=self.update_op)
                if self.fusable(call_args(node)["kv_cache_dtype"])]

    def run(self, graph: fx.Graph) -> int:
        """Nothing to fuse (pass off, no update it may fuse): nothing registered, no matcher, the graph as it
        was. Else register this graph's forms, unify symbolic sizes, match; no match: sizes restored."""
        if not self.enabled():
            return 0
        updates = self.fusable_updates(graph)
        if not updates:
            return 0
        with dynamo_timed(SETUP_TIMER):
            self._register_for(graph, updates)
        if not self.patterns.patterns:
            return 0
        edits = unify_symbolic_sizes(graph)
        with dynamo_timed(MATCH_TIMER), MatchTraces.scope():
            count = self.patterns.apply(graph)
        if not count:
            restore_symbolic_sizes(edits)
        return count
