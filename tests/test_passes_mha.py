"""RopeKVCacheFusionPass, split coalescing and scatter/split replacement on toy MHA models (light backend)."""

from __future__ import annotations

import pytest
import torch

import mla_fuse.compile as mc
from mla_fuse_conformance.pass_models import (
    FUSED_MHA, ROTARY, UNIFIED_MHA, assert_same_results, clone_caches, compile_light, count_calls,
    count_slice_scatters, counting_kernel_calls, final_graph, make_step, mha_caches, mha_model, native_rope_nodes,
    run, same_weights,
)


def _run_pair(form, is_neox, kv_cache_dtype="auto", num_layers=2, rotary_dim=16, **compile_kwargs):
    model = mha_model(num_layers, form, is_neox, rotary_dim=rotary_dim)
    reference = same_weights(model, mha_model(num_layers, form, is_neox, rotary_dim=rotary_dim, use_custom_op=True))
    caches = mha_caches(num_layers, kv_cache_dtype)
    expected_caches = clone_caches(caches)
    step = make_step(5, caches)
    expected = run(reference, expected_caches, step)
    compiled = compile_light(model, **compile_kwargs)
    with counting_kernel_calls() as calls:
        result = run(compiled, caches, step)
    assert_same_results(result, expected, caches, expected_caches)
    return compiled, calls


@pytest.mark.parametrize("form, is_neox, kv_cache_dtype, rotary_dim", [
    ("custom_op", True, "auto", 16),
    ("custom_op", False, "fp8", 16),
    ("custom_op", True, "auto", 8),        # partial rotary
    ("native", False, "auto", 16),
    ("deepseek_native", True, "auto", 16),
], ids=["op-neox", "op-gptj-fp8", "op-partial", "native-gptj", "deepseek-neox"])
def test_fuses_and_matches_eager(form, is_neox, kv_cache_dtype, rotary_dim):
    compiled, calls = _run_pair(form, is_neox, kv_cache_dtype, rotary_dim=rotary_dim)
    graph = final_graph(compiled)
    counts = mc.match_counts(compiled)
    assert counts["rope_kvcache_fusion"] == 2 and counts["defunctionalization"] == 2, counts
    if form == "custom_op":
        assert counts["scatter_split_replacement"] == 2 and counts["split_coalescing"] > 0, counts
    assert count_calls(graph, FUSED_MHA) == 2 and count_calls(graph, UNIFIED_MHA) == 0
    assert count_calls(graph, ROTARY) == 0 and native_rope_nodes(graph) == 0
    assert count_slice_scatters(graph) == 0
    assert calls == {"rope_and_reshape_and_cache_flash": 2}, calls


@pytest.mark.parametrize("compile_kwargs", [
    {"level": 1},
    {"level": 2, "fuse_rope_kvcache": False},
    {"level": 2, "splitting_ops": ("mla_fuse::unified_kv_cache_update",)},
], ids=["O1", "flag-off", "split-point"])
def test_off(compile_kwargs):
    compiled, calls = _run_pair("custom_op", True, num_layers=1, **compile_kwargs)
    graph = final_graph(compiled)
    assert mc.match_counts(compiled).get("rope_kvcache_fusion", 0) == 0
    assert count_calls(graph, FUSED_MHA) == 0 and count_calls(graph, UNIFIED_MHA) == 1
    assert calls == {"reshape_and_cache_flash": 1}, calls  # (the layer calls the rope op directly)
    if compile_kwargs["level"] >= 1:  # utility passes still ran: rope outputs feed the update directly
        assert count_slice_scatters(graph) == 0


def test_o0_runs_no_pass():
    compiled, calls = _run_pair("custom_op", True, num_layers=1, level=0)
    assert mc.match_counts(compiled) == {"defunctionalization": 0}
    assert count_slice_scatters(final_graph(compiled)) == 2  # q and k written back into qkv, as traced
