"""MLARopeKVCacheFusionPass on toy DeepSeek-style models, light backend (graph run eagerly).

Every fused test checks the graph (one fused node per layer, no unfused rope/update, no
``slice_scatter`` write-back of q) and counts kernel calls, besides comparing results, so a
fusion that silently never runs fails.
"""

from __future__ import annotations

import pytest
import torch

from mla_fuse.layers import MLAAttention, RotaryEmbedding, get_forward_context, set_forward_context
from mla_fuse.layers.unified_ops import fused_rope_and_unified_mla_kv_cache_update
from mla_fuse_conformance.pass_models import (
    FUSED_MLA, ROPE_FORMS, ROTARY, UNIFIED_MLA, assert_bitwise, assert_same_results, clone_caches, compile_light,
    count_calls, count_slice_scatters, counting_kernel_calls, final_graph, make_step, mla_caches, mla_model,
    native_rope_nodes, run, same_weights,
)

import mla_fuse.compile as mc


def _eager_reference(model, num_layers, form, is_neox, dtype=torch.bfloat16):
    """The same weights with the custom-op rope: eager calls the unfused kernels."""
    return same_weights(model, mla_model(num_layers, form, is_neox, dtype=dtype, use_custom_op=True))


def _check_fused(compiled, num_layers):
    graph = final_graph(compiled)
    counts = mc.match_counts(compiled)
    assert counts["mla_rope_kvcache_fusion"] == num_layers, counts
    assert counts["defunctionalization"] == num_layers, counts
    assert count_calls(graph, FUSED_MLA) == num_layers
    assert count_calls(graph, UNIFIED_MLA) == 0
    assert count_calls(graph, ROTARY) == 0 and native_rope_nodes(graph) == 0
    assert count_slice_scatters(graph) == 0, "q_pe write-back left after defunctionalization"
    fused_nodes = [n for n in graph.nodes if n.target is FUSED_MLA]
    assert all(n.op == "call_function" for n in fused_nodes)  # in place, not auto_functionalized
    assert sorted(n.kwargs["layer_name"] for n in fused_nodes) == [f"model.layers.{i}.attn" for i in range(num_layers)]


@pytest.mark.parametrize("form", ROPE_FORMS)
@pytest.mark.parametrize("is_neox", [False, True], ids=["gptj", "neox"])
def test_fuses_each_rope_form_and_matches_eager(form, is_neox):
    model = mla_model(2, form, is_neox)
    reference = _eager_reference(model, 2, form, is_neox)
    caches = mla_caches(2)
    expected_caches = clone_caches(caches)
    step = make_step(5, caches)
    expected = run(reference, expected_caches, step)
    compiled = compile_light(model)
    with counting_kernel_calls() as calls:
        result = run(compiled, caches, step)
    _check_fused(compiled, 2)
    assert calls == {"concat_and_cache_mla_rope_fused": 2}, calls
    assert_same_results(result, expected, caches, expected_caches)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fuses_fp8_cache(kv_cache_dtype):
    model = mla_model(1, "custom_op", False)
    caches = mla_caches(1, kv_cache_dtype)
    expected_caches = clone_caches(caches)
    step = make_step(4, caches)
    expected = run(model, expected_caches, step)
    compiled = compile_light(model)
    with counting_kernel_calls() as calls:
        result = run(compiled, caches, step)
    _check_fused(compiled, 1)
    assert calls == {"concat_and_cache_mla_rope_fused": 1}, calls
    assert_same_results(result, expected, caches, expected_caches)


def test_three_layers_each_write_their_own_cache():
    model = mla_model(3, "native", False)
    reference = _eager_reference(model, 3, "native", False)
    caches = mla_caches(3, "auto")
    expected_caches = clone_caches(caches)
    step = make_step(4, caches)
    expected = run(reference, expected_caches, step)
    compiled = compile_light(model)
    result = run(compiled, caches, step)
    _check_fused(compiled, 3)
    assert_same_results(result, expected, caches, expected_caches)
    written = [(entry.kv_cache.view(torch.uint8) != 0x5A).flatten(2).any(-1) for entry in caches.values()]
    assert all(w.sum() == 3 for w in written)  # 4 tokens, the last one padded
    assert not torch.equal(written[0], written[1]) or not torch.equal(written[1], written[2])


def test_dynamic_token_count_compiles_once():
    model = mla_model(2, "custom_op", True)
    compiled = compile_light(model)
    for num_tokens in (3, 6, 2):  # 1 would recompile: dynamo specializes sizes 0 and 1
        caches = mla_caches(2)
        expected_caches = clone_caches(caches)
        step = make_step(num_tokens, caches, seed=num_tokens)
        torch._dynamo.mark_dynamic(step.positions, 0)
        torch._dynamo.mark_dynamic(step.hidden, 0)
        expected = run(model, expected_caches, step)
        with counting_kernel_calls() as calls:
            result = run(compiled, caches, step)
        assert calls["concat_and_cache_mla_rope_fused"] == 2
        assert_same_results(result, expected, caches, expected_caches)
    assert compiled.mla_fuse_backend.pass_manager.graphs_seen == 1
    _check_fused(compiled, 2)


def test_no_slot_mapping_rotates_and_writes_nothing():
    model = mla_model(2, "custom_op", False)
    caches = mla_caches(2)
    expected_caches = clone_caches(caches)
    step = make_step(4, caches)
    step.slot_mapping = {"model.layers.0.attn": step.slot_mapping["model.layers.0.attn"]}  # layer 1: none
    expected = run(model, expected_caches, step)
    compiled = compile_light(model)
    with counting_kernel_calls() as calls:
        result = run(compiled, caches, step)
    _check_fused(compiled, 2)
    assert calls == {"concat_and_cache_mla_rope_fused": 1, "rotary_embedding": 1}, calls
    assert_same_results(result, expected, caches, expected_caches)
    assert (caches["model.layers.1.attn"].kv_cache.view(torch.uint8) == 0x5A).all()


def test_unknown_layer_name_is_a_clear_error():
    caches = mla_caches(1)
    q_pe, k_pe, kv_c = torch.zeros(2, 2, 8, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16), \
        torch.zeros(2, 16, dtype=torch.bfloat16)
    with set_forward_context(caches, {}), pytest.raises(KeyError, match="unknown layer name 'nope'.*model.layers.0"):
        fused_rope_and_unified_mla_kv_cache_update(
            q_pe, k_pe, kv_c, caches["model.layers.0.attn"].kv_cache, torch.zeros(2, dtype=torch.int64),
            torch.zeros(64, 8), False, "nope", "auto", torch.ones(1))


# ------------------------------------------------------------------ near misses: fusion must stay off


def _compile_and_run(model, caches, **compile_kwargs):
    compiled = compile_light(model, **compile_kwargs)
    expected_caches = clone_caches(caches)
    step = make_step(4, caches)
    expected = run(model, expected_caches, step)
    with counting_kernel_calls() as calls:
        result = run(compiled, caches, step)
    assert_same_results(result, expected, caches, expected_caches)
    return compiled, calls


def _check_unfused(compiled, calls, num_layers):
    graph = final_graph(compiled)
    assert mc.match_counts(compiled).get("mla_rope_kvcache_fusion", 0) == 0
    assert count_calls(graph, FUSED_MLA) == 0
    assert count_calls(graph, UNIFIED_MLA) == num_layers
    assert "concat_and_cache_mla_rope_fused" not in calls and calls["concat_and_cache_mla"] == num_layers


@pytest.mark.parametrize("level", [0, 1])
def test_off_at_levels_0_and_1(level):
    compiled, calls = _compile_and_run(mla_model(1), mla_caches(1), level=level)
    _check_unfused(compiled, calls, 1)


def test_off_when_flag_off():
    compiled, calls = _compile_and_run(mla_model(1), mla_caches(1), level=3, fuse_mla_rope_kvcache=False)
    _check_unfused(compiled, calls, 1)


def test_off_when_update_is_a_split_point():
    compiled, calls = _compile_and_run(mla_model(1), mla_caches(1), level=2,
                                       splitting_ops=("mla_fuse::unified_mla_kv_cache_update",))
    _check_unfused(compiled, calls, 1)


def test_off_for_a_cache_format_that_cannot_be_fused():
    compiled, calls = _compile_and_run(mla_model(1), mla_caches(1, "fp8"), level=2,
                                       fusable_kv_cache_dtypes=("auto",))
    _check_unfused(compiled, calls, 1)


class _SinFlippedRope(RotaryEmbedding):
    """Not a supported form: the inverse rotation (``a*cos + b*sin``)."""

    def __init__(self, *args):
        super().__init__(*args, use_custom_op=False)

    def forward_native(self, positions, query, key=None):
        cos, sin = self.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)

        def rotate(x):
            heads = x.view(x.size(0), -1, self.head_size).float()
            a, b = heads[..., 0::2], heads[..., 1::2]
            c, s = cos[:, None, :], sin[:, None, :]
            return torch.stack([a * c + b * s, b * c - a * s], dim=-1).flatten(-2).to(x.dtype).view(x.shape)

        return rotate(query), rotate(key)


def test_off_for_an_unsupported_rope_form():
    compiled, calls = _compile_and_run(mla_model(1, rope_cls=_SinFlippedRope), mla_caches(1))
    _check_unfused(compiled, calls, 1)


class _PreRotationReader(MLAAttention):
    """An MLA layer that also uses k_pe as it was before the rope (a pre-rotation reader)."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        q = self.q_proj(hidden_states).view(-1, self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        latent = self.kv_a_proj_with_mqa(hidden_states)
        kv_c, k_pe = latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe_before = k_pe * 2
        kv_c_normed = self.kv_a_layernorm(kv_c)
        self.rotary_emb(positions, q[..., self.qk_nope_head_dim:], k_pe)
        cache = get_forward_context().layer(self.layer_name)
        dummy = torch.ops.mla_fuse.unified_mla_kv_cache_update(
            kv_c_normed, k_pe, cache.kv_cache, self.layer_name, cache.kv_cache_dtype, cache.k_scale)
        attn = torch.ops.mla_fuse.unified_mla_attention(
            q, cache.kv_cache, self.kv_b_proj.weight, dummy, self.layer_name, cache.kv_cache_dtype, cache.k_scale,
            self.v_head_dim)
        return self.o_proj(attn.flatten(1)), q, k_pe - k_pe_before


def test_off_when_pre_rotation_value_is_read():
    model = mla_model(1, "custom_op", False, layer_cls=_PreRotationReader)
    compiled, calls = _compile_and_run(model, mla_caches(1))
    _check_unfused(compiled, calls, 1)
