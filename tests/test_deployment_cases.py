"""The deployments' cases (``cases/deployment_cases.py``): each builds the tensors its engine's call
passes (placements, cache form, scales, the batch's positions and slots), user deployments are
checked, and the two mutants of layouts that meet in one call fail there and only there."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.cases.deployment_cases import deployment_case, deployment_cases, user_deployments
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS
from mla_fuse_conformance.declarations.operations import OPERATIONS
from mla_fuse_conformance.running.harness import property_named

BY_NAME = {d.name: d for d in DEPLOYMENTS}
MLA_WRITE, FLASH_WRITE = "concat_and_cache_mla", "reshape_and_cache_flash"


def built(name: str, operation: str) -> tensors.Built:
    return tensors.build(deployment_case(BY_NAME[name], operation), "cpu")


def test_every_deployment_has_a_case_for_each_of_its_operations():
    named = {(name, op) for op in OPERATIONS for name in deployment_cases(op)}
    assert named == {(d.name, op) for d in DEPLOYMENTS for op in d.operations}


def test_vllm_mla_passes_a_contiguous_kv_c_beside_a_k_pe_split_from_the_projection():
    args = built("deepseek-v3-tp1-fp8-vllm-decode", "concat_and_cache_mla_rope_fused").args
    assert args["kv_c"].is_contiguous() and args["kv_c"].shape == (4, 512)
    assert args["k_pe"].stride() == (1536 + 512 + 64, 1)  # q_lora_rank + L + R
    assert args["q_pe"].stride() == (128 * 192, 192, 1) and args["q_pe"].shape == (4, 128, 64)
    lite = built("deepseek-v2-lite-tp1-bf16-vllm-decode", MLA_WRITE).args
    assert lite["k_pe"].stride() == (576, 1)  # no q-LoRA: the kv_a projection alone


def test_vllm_flash_caches_are_the_k_v_halves_of_one_pool():
    args = built("llama-3.1-8b-tp1-bf16-vllm-flash-prefill", FLASH_WRITE).args
    key_cache, value_cache = args["key_cache"], args["value_cache"]
    assert key_cache.untyped_storage().data_ptr() == value_cache.untyped_storage().data_ptr()
    assert key_cache.stride() == (16 * 8 * 256, 8 * 256, 256, 1)  # a head's row holds K then V: 2D
    assert value_cache.storage_offset() - key_cache.storage_offset() == 128
    hnd = built("llama-3.1-8b-tp2-fp8-vllm-flashinfer-hnd-decode", FLASH_WRITE).args["key_cache"]
    assert hnd.stride() == (4 * 64 * 256, 256, 64 * 256, 1)  # [NB, Hkv, B, 2D] seen as [NB, B, Hkv, D]
    sglang = built("llama-2-7b-tp1-bf16-sglang-prefill", FLASH_WRITE).args
    assert sglang["value_cache"].storage_offset() - sglang["key_cache"].storage_offset() == 25 * 32 * 128


def _vllm_triton_attn_call(tokens: int, heads: int, kv_heads: int, head_size: int, num_blocks: int,
                           block_size: int, cache_dtype: torch.dtype, layers: int = 2, layer: int = 1) -> dict:
    """The tensors vLLM 0.33.0's Triton attention backend hands ``triton_reshape_and_cache_flash``, built by
    hand statement by statement from vLLM's lines (uint8 for an fp8 cache, the KV-cache spec's dtype)."""
    size, d = (heads + 2 * kv_heads) * head_size, head_size
    # vllm/model_executor/models/llama.py:230: q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    qkv = torch.empty(tokens, size, dtype=torch.bfloat16)
    _, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    # vllm/model_executor/layers/attention/attention.py:541, :543
    key, value = k.view(-1, kv_heads, d), v.view(-1, kv_heads, d)
    # vllm/v1/kv_cache_interface.py:379-414 compute_layout_strides, :469-480 create_kv_cache_views: logical
    # [L, NB, Hkv, B, 2D], stored in the physical order of KVCacheLayout.LBNHC = (0, 1, 3, 2, 4)
    # (vllm/v1/kv_cache_layout.py:24; the default preference, vllm/v1/attention/backends/utils.py:229, as the
    # backend declares no layout, vllm/v1/attention/backend.py:375)
    shape, order = (layers, num_blocks, kv_heads, block_size, 2 * d), (0, 1, 3, 2, 4)
    strides, current = [0] * 5, 1
    for dim in reversed(order):
        strides[dim], current = current, current * shape[dim]
    raw = torch.empty(current, dtype=cache_dtype)  # vLLM's int8 bytes viewed as the spec's dtype: the same strides
    kv_cache = torch.as_strided(raw, shape, strides)[layer]
    # vllm/v1/attention/backends/triton_attn.py:828, do_kv_cache_update: (B, H, N, 2*hs) -> ((B, N, H, hs), ...)
    key_cache, value_cache = kv_cache.transpose(1, 2).split(d, dim=-1)
    return dict(key=key, value=value, key_cache=key_cache, value_cache=value_cache)


@pytest.mark.parametrize("name", ["llama-3.1-8b-tp1-bf16-vllm-triton-attn-decode",
                                  "llama-3.1-8b-tp1-fp8-vllm-triton-attn-prefill"])
def test_vllm_triton_attn_passes_what_do_kv_cache_update_makes(name):
    """vllm-triton-attn's case (the Triton backend's write) against the tensors built by hand from vLLM's lines:
    key and value head views of qkv, the K|V halves of a layer's LBNHC view, int64 slots, one fp32 scale."""
    deployment = BY_NAME[name]
    args = built(name, FLASH_WRITE).args
    fp8 = deployment.kv_cache_dtype.startswith("fp8")
    vllm = _vllm_triton_attn_call(deployment.tokens, deployment.heads, deployment.kv_heads, 128,
                                  deployment.num_blocks(), deployment.block_size, torch.uint8 if fp8 else torch.bfloat16)
    for argument in ("key", "value"):
        assert args[argument].shape == vllm[argument].shape and args[argument].stride() == vllm[argument].stride()
        assert args[argument].storage_offset() == vllm[argument].storage_offset(), argument
    for argument in ("key_cache", "value_cache"):
        assert args[argument].shape == vllm[argument].shape and args[argument].stride() == vllm[argument].stride()
        assert args[argument].dtype == vllm[argument].dtype, argument
    assert (args["value_cache"].storage_offset() - args["key_cache"].storage_offset()
            == vllm["value_cache"].storage_offset() - vllm["key_cache"].storage_offset() == 128)
    # vllm/v1/worker/block_table.py:85: one int64 buffer, passed as a prefix
    assert args["slot_mapping"].dtype == torch.int64 and args["slot_mapping"].is_contiguous()
    if fp8:  # fp8_e4m3, k_scale/v_scale: a [1] fp32 tensor, not 1 (vllm/config/cache.py:49)
        assert args["kv_cache_dtype"] == "fp8_e4m3" and args["k_scale"].shape == (1,)
        assert args["k_scale"].dtype == torch.float32 and float(args["k_scale"]) != 1.0


def test_a_decode_batch_scatters_slots_one_per_block_near_the_table_end():
    deployment = BY_NAME["deepseek-v3-tp8-bf16-vllm-decode"]
    args = built(deployment.name, "concat_and_cache_mla_rope_fused").args
    blocks = args["slot_mapping"] // deployment.block_size
    assert blocks.unique().numel() == deployment.tokens
    rows = args["cos_sin_cache"].size(0)
    assert rows == 163840 and bool((args["positions"] >= rows - 4).all())


def test_a_prefill_chunk_is_consecutive_from_mid_block():
    deployment = BY_NAME["llama-3.1-8b-tp1-bf16-vllm-flashinfer-prefill"]
    args = built(deployment.name, FLASH_WRITE).args
    expected = deployment.block_size // 2 + torch.arange(deployment.tokens)
    assert torch.equal(args["slot_mapping"].cpu(), expected)
    positions = built(deployment.name, "rotary_embedding").args["positions"]
    assert torch.equal(positions.diff(), torch.ones(deployment.tokens - 1, dtype=positions.dtype))


def test_fp8_scales_are_not_one_and_per_head_scales_differ():
    assert float(built("deepseek-v3-tp1-fp8-vllm-prefill", MLA_WRITE).args["scale"]) != 1.0
    per_head = built("llama-2-7b-tp1-fp8-vllm-flash-decode", FLASH_WRITE).args["k_scale"]
    assert per_head.shape == (32,) and per_head.unique().numel() > 1
    assert built("deepseek-v3-tp8-fp8-sglang-prefill", MLA_WRITE).args["kv_cache"].dtype == torch.uint8


def test_user_deployments_are_checked():
    mine = dataclasses.replace(BY_NAME["qwen2.5-7b-tp1-bf16-vllm-flash-decode"], name="my-qwen")
    assert user_deployments(type("Adapter", (), {"deployments": (mine,)})) == (mine,)
    assert user_deployments(object()) == ()
    with pytest.raises(ValueError, match="my-qwen: heads 7, kv_heads 4: per_rank"):
        user_deployments(type("Adapter", (), {"deployments": (dataclasses.replace(mine, heads=7),)}))
    with pytest.raises(ValueError, match="the name of one of the suite's deployments"):
        user_deployments(type("Adapter", (), {"deployments": (BY_NAME["qwen2.5-7b-tp1-bf16-vllm-flash-decode"],)}))
    with pytest.raises(ValueError, match="is not a Deployment"):
        user_deployments(type("Adapter", (), {"deployments": ("qwen",)}))


@pytest.mark.parametrize("mutant, prop, failing, passing", [
    ("k_pe_read_with_kv_c_row_stride", "test_concat_and_cache_mla_in_deployment",
     "deepseek-v2-lite-tp1-bf16-vllm-decode", None),
    ("prefill_dense_block_stride", "test_reshape_and_cache_flash_in_deployment",
     "llama-3.1-405b-tp8-bf16-vllm-flash-prefill", "qwen2.5-7b-tp1-bf16-vllm-flash-decode"),
])
def test_the_layout_mutants_fail_where_their_conditions_meet(mutant, prop, failing, passing):
    prop = property_named(f"test_deployments:{prop}")
    operation = prop.operations[0]
    mutated, base = load_implementation(f"mutant:{mutant}"), load_implementation("mutant:none")
    case = deployment_case(BY_NAME[failing], operation)
    prop.run(base, "cpu", case)
    with pytest.raises(AssertionError):
        prop.run(mutated, "cpu", case)
    if passing is not None:  # a decode batch into the same pool form: below the prefill path
        prop.run(mutated, "cpu", deployment_case(BY_NAME[passing], operation))


ADAPTER = '''
import dataclasses
import json
from mla_fuse_reference.adapter import ReferenceImplementation
from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS

GLM = next(d for d in DEPLOYMENTS if d.name == "glm-4-9b-tp1-bf16-vllm-flash-prefill")

class Mine(ReferenceImplementation):
    deployments = (dataclasses.replace(GLM, name="my-glm-prefill"),)

class Wrong(ReferenceImplementation):
    deployments = (dataclasses.replace(GLM, name="my-glm-prefill", heads=3),)
'''


def test_an_adapters_deployments_run_beside_the_suites(tmp_path):
    import subprocess
    import sys

    (tmp_path / "my_adapter.py").write_text(ADAPTER)
    command = [sys.executable, "-m", "pytest", "--pyargs", "mla_fuse_conformance.properties.test_deployments",
               "--collect-only", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    mine = subprocess.run([*command, "--mla-fuse-impl=my_adapter:Mine"], cwd=tmp_path, capture_output=True, text=True)
    assert "test_reshape_and_cache_flash_in_deployment[my-glm-prefill]" in mine.stdout, mine.stdout + mine.stderr
    assert "test_reshape_and_cache_flash_in_deployment[glm-4-9b-tp1-bf16-vllm-flash-prefill]" in mine.stdout
    wrong = subprocess.run([*command, "--mla-fuse-impl=my_adapter:Wrong"], cwd=tmp_path, capture_output=True,
                           text=True)
    assert wrong.returncode != 0 and "my-glm-prefill: heads 3, kv_heads 2: per_rank(1)" in wrong.stdout + wrong.stderr


CONFTEST = '''
from mla_fuse_conformance.declarations.deployments import Deployment
from mla_fuse_conformance.declarations.presets import Preset

OURS = Preset("our-model", "our config", attention="mha", layers=2, heads=12, kv_heads=4, head_size=128,
              rotary_dim=96, table_rows=8192, is_neox=True)

def pytest_mla_fuse_deployments(config):
    return [Deployment("our-model-tp1-fp8-decode", OURS, 1, 12, 4, "fp8_e4m3", "tensor", 16, "vllm-flash",
                       "decode", 4, ("rotary_embedding", "reshape_and_cache_flash"), "our model, partial rotary", ())]
'''


def test_a_conftest_declares_deployments_of_its_own_model(tmp_path):
    """The ``pytest_mla_fuse_deployments`` hook: a conftest's deployment of a model the suite has no
    preset for runs beside the suite's (and passes on the reference); given twice, one line says so."""
    import subprocess
    import sys

    (tmp_path / "conftest.py").write_text(CONFTEST)
    command = [sys.executable, "-m", "pytest", "--pyargs", "mla_fuse_conformance.properties.test_deployments",
               "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--mla-fuse-impl=reference", "-k", "our-model"]
    ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0 and "2 passed" in ran.stdout, ran.stdout[-3000:] + ran.stderr[-2000:]
    (tmp_path / "conftest.py").write_text(CONFTEST + "\n\ndef pytest_mla_fuse_deployments(config):\n    return [OURS_DEPLOYMENT] * 2\n"
                                          "OURS_DEPLOYMENT = Deployment('twice', OURS, 1, 12, 4, 'auto', 'unit', 16, "
                                          "'vllm-flash', 'decode', 4, ('rotary_embedding',), 'x', ())\n")
    twice = subprocess.run([*command, "--collect-only"], cwd=tmp_path, capture_output=True, text=True)
    assert twice.returncode != 0 and "twice: declared twice" in twice.stdout + twice.stderr, twice.stdout[-2000:]


def test_cases_saved_before_the_placements_were_split_read_as_they_were_meant():
    from mla_fuse_conformance.cases.types import Placement, from_json, to_jsonable

    mla = deployment_case(BY_NAME["deepseek-v2-lite-tp1-bf16-vllm-decode"], MLA_WRITE)
    old = {key: value for key, value in to_jsonable(mla).items() if key not in ("kv_c_place", "k_pe_place")}
    old["kv_place"] = to_jsonable(Placement(pad=(1, 2), offset=(0, 1)))
    read = from_json(json.dumps(old))
    assert read.kv_c_place == read.k_pe_place == Placement(pad=(1, 2), offset=(0, 1))
    flash = deployment_case(BY_NAME["qwen2.5-7b-tp1-bf16-vllm-flash-decode"], FLASH_WRITE)
    old = {key: value for key, value in to_jsonable(flash).items() if key != "kv_form"}
    assert from_json(json.dumps({**old, "shared_pool": True})).kv_form == "flashinfer"
    assert from_json(json.dumps({**old, "shared_pool": False})).kv_form == "split"
