"""What an adapter says of the engine it stands in for (``contract/implementation.py``: ``serves`` and
``guarded_by_caller``), with planted adapters.

* ``serves``: a deployment of a served engine layout runs whatever the adapter declares; a refusal there
  fails (an engine asking for a cache format its configuration allows), where an adapter that serves no
  engine has the same deployment skipped as ``not supported (declared)``.
* ``guarded_by_caller``: a declared limit its callers never reach is still checked, and found unguarded it is
  listed with the caller's guard without failing the verdict; the same limit with no guard fails it.
* Both declarations are checked when the adapter loads: an unknown layout, a guard on a limit not declared,
  a guard with no source each stop the load with a line naming them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mla_fuse_conformance.contract.implementation import ImplementationError, load_implementation

ADAPTERS = '''
import torch
from mla_fuse_reference.adapter import ReferenceImplementation

BF16_ONLY = {"concat_and_cache_mla": {"kv_cache_dtypes": ("auto",)}}


class RefusesFp8Mla(ReferenceImplementation):
    """Declares no fp8 MLA cache and refuses one before writing (as FlagGems refuses vLLM's fp8_e4m3)."""
    capabilities = BF16_ONLY
    concat_and_cache_mla_rope_fused = rotary_embedding = None
    reshape_and_cache_flash = rope_and_reshape_and_cache_flash = None

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        if kv_cache_dtype != "auto":
            raise ValueError(f"Unsupported kv_cache_dtype: {kv_cache_dtype}")
        super().concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


class ServesVllmMla(RefusesFp8Mla):
    serves = {"concat_and_cache_mla": ("vllm-mla",)}


class IgnoresInt32(ReferenceImplementation):
    """Declares int64 positions only and reads int32 ones as the next row (a silent wrong result)."""
    capabilities = {"rotary_embedding": {"position_dtypes": ("int64",)}}

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if positions.dtype != torch.int64:
            positions = (positions.long() + 1) % cos_sin_cache.size(0)
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class CallerGuardsInt32(IgnoresInt32):
    guarded_by_caller = {"rotary_embedding": {"positions dtype int32": "engine/runner.py:12 (positions: torch.long)"}}


class GuardsUndeclared(IgnoresInt32):
    guarded_by_caller = {"rotary_embedding": {"positions dtype int64": "engine/runner.py:12"}}


class GuardsWithoutSource(IgnoresInt32):
    guarded_by_caller = {"rotary_embedding": {"positions dtype int32": " "}}


class ServesNoSuchLayout(RefusesFp8Mla):
    serves = {"concat_and_cache_mla": ("vllm-mla-v9",)}
'''

DEPLOYMENT = "deepseek-v3-tp1-fp8-vllm-decode"  # vllm-mla, fp8 cache


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (tmp_path / "serving_adapters.py").write_text(ADAPTERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _env(user_dir):
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST") and key != "CI"}
    return dict(env, PYTHONPATH=str(user_dir), MLA_FUSE_FAILURE_DIR=str(user_dir / "failures"))


@pytest.mark.parametrize("adapter, outcome", [("RefusesFp8Mla", "1 skipped"), ("ServesVllmMla", "1 failed")])
def test_a_served_deployment_runs_whatever_is_declared(user_dir, adapter, outcome):
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "--pyargs",
                           "mla_fuse_conformance.properties.test_deployments", f"--mla-fuse-impl=serving_adapters:{adapter}",
                           "-k", f"test_concat_and_cache_mla_in_deployment and {DEPLOYMENT}"],
                          cwd=user_dir, env=_env(user_dir), capture_output=True, text=True, timeout=600)
    assert outcome in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    if outcome == "1 skipped":
        assert "not supported (declared): kv_cache_dtype fp8_e4m3" in done.stdout
    else:
        assert "ValueError: Unsupported kv_cache_dtype: fp8_e4m3" in done.stdout
        (failure,) = (user_dir / "failures").rglob("*.json")
        assert json.loads(failure.read_text())["served"] == "vllm-mla"
        replay = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "repro", str(failure)], cwd=user_dir,
                                env=_env(user_dir), capture_output=True, text=True, timeout=600)
        assert replay.returncode == 1 and "REPRODUCED" in replay.stdout, replay.stdout + replay.stderr
        assert "a deployment of vllm-mla, which the implementation serves" in replay.stdout


@pytest.mark.parametrize("adapter, verdict", [("IgnoresInt32", "FAIL"), ("CallerGuardsInt32", "PASS")])
def test_a_limit_guarded_by_its_caller_is_listed_and_does_not_fail_the_verdict(user_dir, adapter, verdict):
    done = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", f"serving_adapters:{adapter}",
                           "-n", "1", "--map-rounds", "1", "--", "-k", "test_rotary_embedding_matches_reference"],
                          cwd=user_dir, env=_env(user_dir), capture_output=True, text=True, timeout=900)
    report = json.loads((user_dir / ".mla_fuse_reports" / "report.json").read_text())
    (check,) = [c for c in report["limits"] if c["axis"] == "positions dtype"]
    assert check["outcome"] == "unguarded: wrong result", check
    assert report["verdict"] == verdict and done.returncode == (verdict == "FAIL"), done.stdout[-3000:]
    limit_id = "limit | rotary_embedding: positions dtype int32 | unguarded: wrong result"
    assert (limit_id in report["failing"]) == (verdict == "FAIL")
    if verdict == "PASS":
        assert check["guarded_by"] == "engine/runner.py:12 (positions: torch.long)"
        assert "guarded by its caller: engine/runner.py:12 (positions: torch.long)" in done.stdout
        summary = (user_dir / ".mla_fuse_reports" / "summary.md").read_text()
        assert "engine/runner.py:12 (positions: torch.long)" in summary


@pytest.mark.parametrize("adapter, message", [
    ("GuardsUndeclared", "'positions dtype int64' is not one of its declared limits (positions dtype int32)"),
    ("GuardsWithoutSource", "positions dtype int32: say which caller guards it and where (path:line)"),
    ("ServesNoSuchLayout", "['vllm-mla-v9'] not engine layouts"),
])
def test_the_declarations_are_checked_when_the_adapter_loads(user_dir, adapter, message):
    with pytest.raises(ImplementationError, match=None) as raised:
        load_implementation(f"serving_adapters:{adapter}")
    assert message in str(raised.value), str(raised.value)


def test_a_map_whose_failing_examples_are_served_deployments_outside_the_limits_names_them(user_dir, tmp_path,
                                                                                           monkeypatch):
    """The map moves cases inside the declared limits, so a served deployment that failed outside them (FlagGems'
    vLLM MLA deployments with ``fp8_e4m3``) is no case of its search or its reruns; its note names the limits those
    failing examples lie outside, where it said the test run left no failing example to rerun."""
    import torch

    from mla_fuse_conformance.cases.deployment_cases import deployment_cases
    from mla_fuse_conformance.commands.conformance_map.property_map import map_property
    from mla_fuse_conformance.running.harness import property_named

    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path / "failures"))
    impl = load_implementation("serving_adapters:ServesVllmMla")
    prop = property_named("test_deployments:test_concat_and_cache_mla_in_deployment")
    served = deployment_cases("concat_and_cache_mla")[DEPLOYMENT]
    result = map_property(prop, impl, "cpu", lambda case: prop.run(impl, torch.device("cpu"), case), max_examples=3,
                          rounds=1, known=(served,))
    assert not result.cells and "outside the declared limits (kv_cache_dtype fp8_e4m3)" in result.note, result.note
    assert "left no failing example" not in result.note
