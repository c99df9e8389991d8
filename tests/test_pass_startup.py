"""What the fusion passes cost at start-up, counted, never timed (figures: docs/STARTUP.md).

* Set-up does not grow with depth: the patterns a fusion traces and registers are the same for
  1 and 3 layers of one shape (one per rope form and style, never one per layer name), and every
  layer still fuses with its own name, also when the layers share one rope module.
* A fusion with nothing to match costs nothing: it traces nothing, runs no matcher, and the
  compile is the compile without it: same graph after the passes, same number of graphs, same
  Inductor counters.

Light backend (Inductor's graph passes, no code generation) and hand-built FX graphs.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch._dynamo.utils import counters

import mla_fuse.compile as mc
from mla_fuse.layers.unified_ops import UNIFIED_MLA_UPDATE
from mla_fuse.passes import FusionConfig, pattern_utils
from mla_fuse.passes.mla_rope_kvcache_fusion import MLARopeKVCacheFusionPass
from mla_fuse.passes.fx_utils import call_args
from mla_fuse.passes.pattern_utils import MatchTraces
from mla_fuse.passes.rope_kvcache_fusion import RopeKVCacheFusionPass
from mla_fuse_conformance.compile_passes.inspection import (
    FUSED_OP, PASS_NAME, UNIFIED_OP, assert_same_results, count_calls, final_graph, layer_of,
)
from mla_fuse_conformance.compile_passes.models import (
    build_model, MhaGeometry, ModelSpec, run, same_weights, toy_caches, toy_step,
)

FUSION_PASS = {"mla": MLARopeKVCacheFusionPass, "mha": RopeKVCacheFusionPass}
FLAG = {"mla": "fuse_mla_rope_kvcache", "mha": "fuse_rope_kvcache"}
OTHER = {"mla": "mha", "mha": "mla"}


def _spec(kind: str, layers: int, form: str, shared_rope: bool = False) -> ModelSpec:
    return ModelSpec((kind,) * layers, ("plain",) * layers, rope=form, shared_rope=shared_rope,
                     mha=MhaGeometry(rotary_dim=16))


def _fusion_pass(compiled, kind: str):
    return next(p for p in compiled.mla_fuse_backend.pass_manager.passes if isinstance(p, FUSION_PASS[kind]))


def _compile_and_check(kind: str, layers: int, form: str, shared_rope: bool = False):
    """Light compile of ``layers`` layers at O2 from an empty pattern cache, checked bit for bit against
    eager with the unfused kernels; returns the compiled model."""
    spec = _spec(kind, layers, form, shared_rope)
    model = build_model(spec)
    reference = same_weights(model, build_model(spec, use_custom_op=True))
    caches, step = toy_caches(kind, layers), toy_step(kind, layers, 5)
    expected_caches = caches.clone()
    expected = run(reference, expected_caches.layers, step)
    pattern_utils.clear_pattern_cache()
    torch._dynamo.reset()
    compiled = mc.compile(model, backend="light")
    assert_same_results(run(compiled, caches.layers, step, dynamic=True), expected, caches, expected_caches)
    graph = final_graph(compiled)
    assert mc.match_counts(compiled)[PASS_NAME[kind]] == layers
    assert count_calls(graph, UNIFIED_OP[kind]) == 0
    assert sorted(layer_of(n) for n in graph.nodes if n.op == "call_function" and n.target is FUSED_OP[kind]) \
        == spec.layer_names  # each layer's fused op names its own layer
    return compiled


@pytest.mark.parametrize("kind, form", [("mla", "deepseek_native"), ("mha", "native"), ("mla", "custom_op")])
def test_setup_does_not_grow_with_layers(kind, form):
    """Set-up traces per form, and the exact re-check of a match traces the search pattern once per form
    and shape: the same counts for 1 and 3 layers; the other layers' re-checks are copies."""
    setups, retraces = [], []
    for layers in (1, 3):
        hits, misses = MatchTraces.hits, MatchTraces.misses
        compiled = _compile_and_check(kind, layers, form)
        setups.append((pattern_utils.traced_pattern_count(), _fusion_pass(compiled, kind).registered))
        retraces.append((MatchTraces.misses - misses, MatchTraces.hits - hits))
    assert setups[0] == setups[1], f"(traced, registered) for 1 and 3 layers: {setups}"
    # the forms and styles the graph shows (MHA native forms: two output shapes each), never one per layer
    assert setups[0][0] <= (8 if (kind, form) == ("mha", "native") else 4), setups
    assert retraces == [(1, 0), (1, 2)], f"(search re-traces, copies) for 1 and 3 layers: {retraces}"


def test_match_traces_keep_one_trace_per_shape_and_put_in_each_layer_name():
    """Within a scope a re-trace with the same input shapes is the first one's graph with the new layer name;
    other shapes, strides or dtypes trace again; each caller gets its own copy; outside a scope every call
    traces."""
    traced = []

    def update(kv_c, k_pe, k_scale, layer_name):
        traced.append(layer_name)
        return UNIFIED_MLA_UPDATE(kv_c_normed=kv_c, k_pe=k_pe, layer_name=layer_name, kv_cache_dtype="auto",
                                  k_scale=k_scale)

    def layer_names(gm):
        return [call_args(node)["layer_name"] for node in gm.graph.nodes if node.target is UNIFIED_MLA_UPDATE]

    owner = object()
    with pattern_utils.fake_mode():
        bf16 = dict(dtype=torch.bfloat16)
        inputs = [torch.empty(4, 32, **bf16), torch.empty(4, 16, **bf16), torch.empty(1)]
        wider = [torch.empty(4, 64, **bf16), *inputs[1:]]
        strided = [torch.empty(4, 64, **bf16)[:, :32], *inputs[1:]]
        halves = [inputs[0].half(), *inputs[1:]]
        with MatchTraces.scope():
            first = MatchTraces.trace(owner, update, [*inputs, "layers.0"])
            second = MatchTraces.trace(owner, update, [*inputs, "layers.1"])
            others = [MatchTraces.trace(owner, update, [*args, "layers.2"]) for args in (wider, strided, halves)]
            for node in first.graph.nodes:  # a caller changes its copy (torch renames placeholders in place)
                node.args = tuple("tampered" if arg == "layers.0" else arg for arg in node.args)
            again = MatchTraces.trace(owner, update, [*inputs, "layers.3"])
        outside = MatchTraces.trace(owner, update, [*inputs, "layers.4"])
    assert traced == ["layers.0", "layers.2", "layers.2", "layers.2", "layers.4"]
    assert layer_names(second) == ["layers.1"] and layer_names(again) == ["layers.3"]
    assert str(second.graph).replace("layers.1", "layers.3") == str(again.graph)
    assert [layer_names(gm) for gm in others] == [["layers.2"]] * 3
    assert layer_names(first) == ["tampered"]  # the copy handed out was changed, not the kept trace
    assert layer_names(outside) == ["layers.4"]


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_layers_sharing_one_rope_each_fuse_with_their_own_name(kind):
    _compile_and_check(kind, 3, "native", shared_rope=True)


def _inductor_counters_of(compile_and_run) -> collections.Counter:
    before = counters["inductor"].copy()
    compile_and_run()
    return counters["inductor"] - before  # positive changes only (a pass adding 0 leaves no trace)


def _light_compile(kind: str, config: FusionConfig):
    spec = _spec(kind, 2, "native")
    torch._dynamo.reset()
    compiled = mc.compile(build_model(spec), backend="light", config=config)
    changes = _inductor_counters_of(lambda: run(compiled, toy_caches(kind, 2).layers, toy_step(kind, 2, 5),
                                                dynamic=True))
    return compiled, changes


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_a_fusion_with_nothing_to_match_changes_nothing(kind):
    """A ``kind`` model with only the other kind's fusion on compiles as at O1: the same graph after the
    passes, as many graphs, the same Inductor counters; the fusion traced and registered nothing."""
    other_only = {FLAG[OTHER[kind]]: True, FLAG[kind]: False}
    without, without_counters = _light_compile(kind, FusionConfig(level=1))
    pattern_utils.clear_pattern_cache()
    with_other, with_other_counters = _light_compile(kind, FusionConfig(level=2, **other_only))
    assert pattern_utils.traced_pattern_count() == 0
    assert _fusion_pass(with_other, OTHER[kind]).registered == 0
    assert len(mc.graph_records(with_other)) == len(mc.graph_records(without)) == 1
    assert str(final_graph(with_other)) == str(final_graph(without))
    assert with_other_counters == without_counters
    assert not any(mc.match_counts(with_other).values())


def test_a_graph_without_the_update_op_is_left_untouched():
    """On a hand-built graph with dynamic sizes in two nodes (what ``unify_symbolic_sizes`` rewrites) and no
    cache update: no pattern traced or registered, not one node or argument changed."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(positions, x):
        return x * positions.size(0) + x.size(0)

    gm = make_fx(fn, tracing_mode="symbolic")(torch.arange(4), torch.randn(4, 8))
    before = str(gm.graph)
    for kind, fusion in FUSION_PASS.items():
        pattern_utils.clear_pattern_cache()
        graph_pass = fusion(FusionConfig(level=2))
        graph_pass(gm.graph)
        assert graph_pass.matched_count == 0 and graph_pass.registered == 0, kind
        assert pattern_utils.traced_pattern_count() == 0, kind
        assert str(gm.graph) == before, kind


def test_unified_sizes_are_restored_when_nothing_matches():
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(positions, x):
        return x.view(positions.size(0), 2, -1), x.view(x.size(0), -1, 2)

    gm = make_fx(fn, tracing_mode="symbolic")(torch.arange(4), torch.randn(4, 8))
    before = str(gm.graph)
    edits = pattern_utils.unify_symbolic_sizes(gm.graph)
    assert edits and str(gm.graph) != before
    pattern_utils.restore_symbolic_sizes(edits)
    assert str(gm.graph) == before
