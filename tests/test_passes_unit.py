"""Config resolution, pass hashing, op declarations, and the utility passes on hand-built graphs."""

from __future__ import annotations

import operator

import pytest
import torch

from mla_fuse.layers import unified_ops
from mla_fuse.passes import FusionConfig, OptimizationLevel, PostGradPassManager
from mla_fuse.passes.inductor_pass import hash_source
from mla_fuse.passes.mla_rope_kvcache_fusion import MLARopeKVCacheFusionPass
from mla_fuse.passes.scatter_split_replace import ScatterSplitReplacementPass
from mla_fuse.passes.split_coalescing import SplitCoalescingPass


@pytest.mark.parametrize("level, flag, splitting_ops, expected", [
    (0, None, (), False), (1, None, (), False), (2, None, (), True), (3, None, (), True),
    (0, True, (), False), (1, True, (), True), (2, False, (), False),
    (2, None, ("mla_fuse::unified_mla_kv_cache_update",), False),
    (3, True, ("mla_fuse.unified_mla_kv_cache_update.default",), False),
    (2, None, ("mla_fuse::unified_kv_cache_update",), True),  # the MHA op: not the MLA fusion's split point
])
def test_mla_fusion_enabled(level, flag, splitting_ops, expected):
    config = FusionConfig(level=level, fuse_mla_rope_kvcache=flag, splitting_ops=splitting_ops)
    assert config.mla_rope_kvcache_enabled is expected


def test_levels_choose_passes():
    def names(level):
        return [p.name for p in PostGradPassManager(FusionConfig(level=level)).passes]
    assert names(OptimizationLevel.O0) == []
    assert names(1) == ["split_coalescing", "scatter_split_replacement"]
    assert names(2) == names(3) == [*names(1), "mla_rope_kvcache_fusion", "rope_kvcache_fusion"]


def test_unknown_kv_cache_dtype_in_config_is_an_error():
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        FusionConfig(fusable_kv_cache_dtypes=("auto", "fp8_ds_mla"))


def test_pass_hash_covers_source_and_config():
    base = PostGradPassManager(FusionConfig(level=2)).uuid()
    assert base == PostGradPassManager(FusionConfig(level=2)).uuid()
    assert base != PostGradPassManager(FusionConfig(level=3)).uuid()
    assert base != PostGradPassManager(FusionConfig(level=2, fusable_kv_cache_dtypes=("auto",))).uuid()
    assert MLARopeKVCacheFusionPass().uuid() != MLARopeKVCacheFusionPass(FusionConfig(level=1)).uuid()
    assert hash_source("def f(): return 1") != hash_source("def f(): return 2")


@pytest.mark.parametrize("op, written", [
    (unified_ops.UNIFIED_MLA_UPDATE, set()),
    (unified_ops.FUSED_MLA_UPDATE, {"q_pe", "k_pe"}),
    (unified_ops.UNIFIED_UPDATE, set()),
    (unified_ops.FUSED_UPDATE, {"query", "key"}),
])
def test_ops_declare_every_graph_tensor_they_write_and_are_never_dropped(op, written):
    """The caches are not arguments (fetched at run time): the ops declare the q/k they rotate, and
    count as side-effecting so dead-code elimination never drops a cache write."""
    declared = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert declared == written
    assert torch._library.utils.is_impure(op)
    assert not any("cache" in a.name and a.type.kind() == "TensorType" for a in op._schema.arguments
                   if a.name != "cos_sin_cache")


def test_op_signatures_follow_vllm():
    def names(op):
        return [a.name for a in op._schema.arguments]
    assert names(unified_ops.UNIFIED_MLA_UPDATE) == ["kv_c_normed", "k_pe", "layer_name", "kv_cache_dtype", "k_scale"]
    assert names(unified_ops.FUSED_MLA_UPDATE) == ["positions", "q_pe", "k_pe", "kv_c", "cos_sin_cache", "is_neox",
                                                   "layer_name", "kv_cache_dtype", "k_scale"]
    assert names(unified_ops.UNIFIED_UPDATE)[:3] == ["key", "value", "layer_name"]
    assert names(unified_ops.FUSED_UPDATE)[:7] == ["query", "key", "value", "positions", "cos_sin_cache", "is_neox",
                                                   "layer_name"]


def _graph(fn, *args) -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(fn)(*args)


def test_split_coalescing_merges_identical_splits():
    def fn(x):
        a = torch.ops.aten.split_with_sizes.default(x, [2, 3], -1)
        b = torch.ops.aten.split_with_sizes.default(x, [2, 3], 1)
        c = torch.ops.aten.split_with_sizes.default(x, [3, 2], -1)  # other sizes: kept
        return a[0] + 1, b[1] * 2, c[0]
    gm = _graph(fn, torch.randn(4, 5))
    x = torch.randn(4, 5)
    expected = gm(x)
    graph_pass = SplitCoalescingPass()
    graph_pass(gm.graph)
    gm.recompile()
    assert graph_pass.matched_count == 1
    assert len(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.split_with_sizes.default)) == 2
    for a, e in zip(gm(x), expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def _rope_scatter_graph(extra_reader: bool):
    """A functional graph as functionalization writes an in-place rope of q and k of a packed qkv."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    def fn(qkv, positions, table):
        q, k, v = torch.ops.aten.split_with_sizes.default(qkv, [8, 8, 8], -1)
        rope = auto_functionalized(torch.ops.mla_fuse.rotary_embedding.default, positions=positions, query=q,
                                   key=k, head_size=8, cos_sin_cache=table, is_neox=True)
        s1 = torch.ops.aten.slice_scatter.default(qkv, rope[1], 1, 0, 8)
        s2 = torch.ops.aten.slice_scatter.default(s1, rope[2], 1, 8, 16)
        q2, k2, v2 = torch.ops.aten.split_with_sizes.default(s2, [8, 8, 8], -1)
        out = q2 * 2 + k2 + v2
        return (out, s1.sum()) if extra_reader else (out,)
    return _graph(fn, torch.randn(3, 24), torch.arange(3), torch.randn(16, 8))


def test_scatter_split_replacement_points_users_at_rope_outputs():
    gm = _rope_scatter_graph(extra_reader=False)
    args = torch.randn(3, 24), torch.arange(3), torch.randn(16, 8)
    expected = gm(*args)
    graph_pass = ScatterSplitReplacementPass()
    graph_pass(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    assert graph_pass.matched_count == 1
    assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.slice_scatter.default)
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)


def test_scatter_split_replacement_keeps_a_scatter_with_other_users():
    gm = _rope_scatter_graph(extra_reader=True)
    graph_pass = ScatterSplitReplacementPass()
    graph_pass(gm.graph)
    assert graph_pass.matched_count == 0
    assert len(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.slice_scatter.default)) == 2
    assert not any(n.target is operator.getitem and n.args[0].target is torch.ops.aten.split_with_sizes.default
                   and n.args[0].args[0].target is torch.ops.aten.slice_scatter.default and not n.users
                   for n in gm.graph.nodes if n.op == "call_function")
