"""The engine layouts and named deployments (declarations/engine_layouts.py, deployments.py) hold
together: names exist and are unique, block sizes and scales are ones the engine uses, per-rank
sizes are what ``Preset.per_rank`` gives, every view fits its parent, sources are ``path:line``.
What needs the engines' sources is ``ci/check_engine_sources.py DIR``'s job, not this file's."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import runpy

import pytest

from mla_fuse_conformance.cases.engine_caches import ENGINE_LAYOUTS, KV_FORMS, POOLS
from mla_fuse_conformance.declarations.deployments import (DEPLOYMENTS, SOURCE_FORM, cpu_elements,
                                                           problems_of)
from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS, placement_of, size_of
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS, OPERATIONS
from mla_fuse_conformance.declarations.presets import PRESETS

ROOT = pathlib.Path(__file__).resolve().parents[1]
INPUT_ARGUMENTS = {"query", "key", "value", "q_pe", "k_pe", "kv_c"}
CPU_ELEMENT_LIMIT = 1_500_000  # inputs and cache of one example, through Triton's interpreter
BY_NAME = {deployment.name: deployment for deployment in DEPLOYMENTS}


def test_every_deployment_is_well_formed():
    problems = [problem for deployment in DEPLOYMENTS for problem in problems_of(deployment)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("change, expected", [
    (dict(preset="deepseek-v4"), "preset 'deepseek-v4' or layout"),
    (dict(layout="vllm-flash"), "a mla preset on a mha layout"),
    (dict(heads=128), "per_rank(8) gives 16"),
    (dict(tp=3), "tp 3 not in"),
    (dict(block_size=24), "block size 24 not allowed by vllm-mla"),
    (dict(operations=("reshape_and_cache_flash",)), "not all among the layout's"),
    (dict(operations=()), "not all among the layout's"),
    (dict(kv_cache_dtype="fp8_e4m3", scale="per_head"), "scale 'per_head' not one vllm-mla passes"),
    (dict(kv_cache_dtype="auto", scale="tensor"), "scale 'tensor' not one vllm-mla passes with a auto cache"),
    (dict(kv_cache_dtype="int4"), "kv_cache_dtype 'int4' unknown"),
    (dict(batch="chunk"), "batch 'chunk' not in"),
    (dict(sources=("vllm/config/cache.py",)), "not all path:line"),
])
def test_a_planted_defect_is_reported(change, expected):
    planted = dataclasses.replace(BY_NAME["deepseek-v3-tp8-bf16-vllm-decode"], **change)
    assert any(expected in problem for problem in problems_of(planted)), problems_of(planted)


def test_names_are_unique_across_the_suite():
    deployment_names = [deployment.name for deployment in DEPLOYMENTS]
    assert len(set(deployment_names)) == len(deployment_names), "a deployment name is used twice"
    assert all(name == layout.name for name, layout in LAYOUTS.items())
    clashes = (set(LAYOUTS) & set(ENGINE_LAYOUTS)) | (set(LAYOUTS) & set(deployment_names))
    assert not clashes, f"one name per layout and form across the suite: {clashes}"


def test_at_most_about_thirty_deployments_each_small_on_the_cpu():
    assert len(DEPLOYMENTS) <= 34
    costly = {d.name: cpu_elements(d) for d in DEPLOYMENTS
              if cpu_elements(d)["inputs"] + cpu_elements(d)["cache"] > CPU_ELEMENT_LIMIT}
    assert not costly, f"over {CPU_ELEMENT_LIMIT:,} elements on the CPU: {costly}"


def test_a_prefill_chunk_is_past_every_decode_batch():
    decode = max(d.tokens for d in DEPLOYMENTS if d.batch == "decode")
    prefill = min(d.tokens for d in DEPLOYMENTS if d.batch == "prefill")
    assert prefill > decode, f"prefill chunks of {prefill} tokens, decode batches up to {decode}"


def test_the_deployments_cover_the_issue():
    def some(**fields) -> bool:
        return any(all(getattr(d, key) == value for key, value in fields.items()) for d in DEPLOYMENTS)

    for tp in (1, 8):
        assert some(preset="deepseek-v3", tp=tp, kv_cache_dtype="fp8_e4m3")
        assert some(preset="deepseek-v3", tp=tp, kv_cache_dtype="auto") or some(
            preset="deepseek-v3", tp=tp, kv_cache_dtype="bfloat16")
        engines = {LAYOUTS[d.layout].engine for d in DEPLOYMENTS if (d.preset, d.tp) == ("deepseek-v3", tp)}
        assert engines >= {"vllm", "sglang"}, f"DeepSeek-V3 at TP {tp} runs on {engines} only"
    assert some(preset="llama-3.1-8b", layout="vllm-flash") and some(preset="llama-3.1-8b", layout="vllm-flashinfer")
    # vLLM's Triton backend (the call --impl vllm-triton serves): a bf16 and an fp8 cache
    assert some(layout="vllm-triton-attn", kv_cache_dtype="auto") and some(layout="vllm-triton-attn", scale="tensor")
    assert some(preset="llama-3.1-8b", batch="prefill")
    assert some(preset="llama-3.1-405b", tp=1) and some(preset="llama-3.1-405b", tp=8)
    assert some(scale="tensor") and some(scale="per_head")
    named = {d.preset for d in DEPLOYMENTS}
    assert {"deepseek-v2-lite", "kimi-k2", "llama-2-7b", "gemma-7b", "glm-4-9b"} <= named
    assert any(preset.startswith("qwen2.5") for preset in named)


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=list(LAYOUTS))
def test_a_layout_names_the_suites_operations_arguments_and_forms(layout):
    assert set(layout.operations) <= set(OPERATIONS)
    for view in layout.views:
        assert view.operations and set(view.operations) <= set(layout.operations), view
        for operation in view.operations:
            assert view.argument in OPERATION_ARGUMENTS[operation], (view.argument, operation)
        assert len(view.shape) == len(view.parent_shape) == len(view.start), view
    for operation in layout.operations:
        needed = INPUT_ARGUMENTS & set(OPERATION_ARGUMENTS[operation])
        placed = {view.argument for view in layout.views if operation in view.operations}
        assert needed <= placed, f"{layout.name}: no view of {needed - placed} for {operation}"
    assert layout.cache.pool in POOLS
    assert layout.cache.kv in (("",) if layout.attention == "mla" else KV_FORMS)
    assert layout.allows_block_size(layout.block_default)
    assert all(SOURCE_FORM.match(source) for source in layout.all_sources()), layout.all_sources()


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d.name for d in DEPLOYMENTS])
def test_every_view_of_a_deployment_fits_its_parent(deployment):
    layout, sizes = LAYOUTS[deployment.layout], deployment.sizes()
    for view in layout.views:
        numbers = placement_of(view, sizes)
        assert all(0 <= offset <= pad for offset, pad in zip(numbers["offset"], numbers["pad"])), (view, numbers)


@pytest.mark.parametrize("preset, q_lora_rank, parent_width", [
    ("deepseek-v3", 1536, 2112), ("kimi-k2", 1536, 2112), ("deepseek-v2-lite", 0, 576)])
def test_k_pe_sits_at_its_columns_of_the_kv_a_projection(preset, q_lora_rank, parent_width):
    """DeepSeek's k_pe: columns [q_lora_rank + L, q_lora_rank + L + R) of a [T, q_lora_rank + L + R] row."""
    sizes = dict(PRESETS[preset].per_rank(1), tokens=3, q_lora_rank=q_lora_rank)
    k_pe = next(view for view in LAYOUTS["vllm-mla"].views if view.argument == "k_pe")
    assert [size_of(e, sizes) for e in k_pe.parent_shape] == [3, parent_width]
    assert placement_of(k_pe, sizes) == dict(pad=(0, parent_width - 64), offset=(0, q_lora_rank + 512))


def test_mha_q_k_v_are_column_splits_of_one_projection():
    """Llama-3.1-8B: q, k, v at columns 0, 4096 and 5120 of a 6144-wide qkv row (32 + 2 x 8 heads of 128)."""
    sizes = dict(PRESETS["llama-3.1-8b"].per_rank(1), tokens=2)
    views = {(v.argument, len(v.shape)): placement_of(v, sizes) for v in LAYOUTS["vllm-flash"].views}
    assert views[("query", 2)] == dict(pad=(0, 6144 - 4096), offset=(0, 0))
    assert views[("key", 2)] == dict(pad=(0, 6144 - 1024), offset=(0, 4096))
    assert views[("key", 3)] == dict(pad=(0, 40, 0), offset=(0, 32, 0))
    assert views[("value", 3)] == dict(pad=(0, 40, 0), offset=(0, 40, 0))


def test_size_of_rejects_what_is_not_a_size_expression():
    assert size_of("(heads + 2 * kv_heads) * head_size", dict(heads=32, kv_heads=8, head_size=128)) == 6144
    with pytest.raises(ValueError, match="names 'lora'"):
        size_of("lora + 1", dict(heads=1))
    with pytest.raises(ValueError, match="not a sum or product"):
        size_of("heads / 2", dict(heads=4))


def test_cpu_elements_counts_parents_once_and_the_cache():
    deployment = BY_NAME["deepseek-v3-tp8-bf16-vllm-decode"]  # 8 tokens, 16 heads, 16-slot blocks
    elements = cpu_elements(deployment)
    assert elements["inputs"] == 8 * 16 * 192 + 8 * 2112 + 8 * 512  # q, the q-LoRA/KV-A row, kv_c
    assert elements["cache"] == (8 + 1) * 16 * 576
    assert elements["table"] == 163840 * 64
    assert math.ceil((8 + 40) / 16) + 1 == BY_NAME["deepseek-v2-lite-tp1-fp8-vllm-prefill"].num_blocks()


def test_the_source_check_sees_a_moved_line(tmp_path):
    """ci/check_engine_sources.py on a planted engine tree: a call moved, a file shortened or gone."""
    check = runpy.run_path(str(ROOT / "ci" / "check_engine_sources.py"))["check"]
    (tmp_path / "vllm" / "vllm").mkdir(parents=True)
    (tmp_path / "vllm" / "vllm" / "ops.py").write_text("a\n  ops.concat_and_cache_mla(\nb\n")
    assert check(tmp_path, "vllm/ops.py:2", "concat_and_cache_mla") == ("", "ops.concat_and_cache_mla(")
    assert "is not within 3 lines" in check(tmp_path, "vllm/ops.py:2", "reshape_and_cache_flash")[0]
    assert "the file has 3 lines" in check(tmp_path, "vllm/ops.py:9")[0]
    assert "no such file" in check(tmp_path, "sglang/ops.py:1")[0]
