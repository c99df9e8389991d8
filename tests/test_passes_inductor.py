"""End to end on real Inductor (C++ codegen on CPU, ~10 s+ a compile): the passes installed as
``post_grad_custom_post_pass``. Two tests only; the light backend covers the rest.

q, k and the caches are compared bit for bit (both sides call the same kernels on the same
projection outputs); the model output only closely, since Inductor generates its own code
for the residual add and o_proj epilogue."""

from __future__ import annotations

import torch

import mla_fuse.compile as mc
from mla_fuse.layers import unified_ops
from mla_fuse_conformance.pass_models import (
    assert_same_results, clone_caches, counting_kernel_calls, make_step, mha_caches, mha_model, mla_caches,
    mla_model, run, same_weights,
)


def _compile_inductor(model):
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):  # counts only mean something on a real compile
        return mc.compile(model, backend="inductor", level=2)


def _run_compiled(compiled, caches, step):
    with torch._inductor.config.patch(fx_graph_cache=False), counting_kernel_calls() as calls:
        return run(compiled, caches, step), calls


def test_inductor_fuses_mla_custom_op_rope_bitwise():
    model = mla_model(1, "custom_op", False)
    caches = mla_caches(1, "fp8")
    expected_caches = clone_caches(caches)
    step = make_step(5, caches)
    expected = run(model, expected_caches, step)
    compiled = _compile_inductor(model)
    result, calls = _run_compiled(compiled, caches, step)
    counts = mc.match_counts(compiled)
    assert counts["mla_rope_kvcache_fusion"] == 1 and counts["defunctionalization"] == 1, counts
    assert calls == {"concat_and_cache_mla_rope_fused": 1}, calls
    assert_same_results(result, expected, caches, expected_caches, output_exact=False)


def test_inductor_fuses_mha_native_rope():
    model = mha_model(1, "native", True)
    reference = same_weights(model, mha_model(1, "native", True, use_custom_op=True))
    caches = mha_caches(1)
    expected_caches = clone_caches(caches)
    step = make_step(5, caches)
    expected = run(reference, expected_caches, step)
    compiled = _compile_inductor(model)
    result, calls = _run_compiled(compiled, caches, step)
    counts = mc.match_counts(compiled)
    assert counts["rope_kvcache_fusion"] == 1 and counts["defunctionalization"] == 1, counts
    assert calls == {"rope_and_reshape_and_cache_flash": 1}, calls
    assert_same_results(result, expected, caches, expected_caches, output_exact=False)
    assert unified_ops.FUSED_UPDATE is torch.ops.mla_fuse.fused_rope_and_unified_kv_cache_update.default
