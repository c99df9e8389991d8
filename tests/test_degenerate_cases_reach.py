"""Degenerate and large cases reach every implementation, whatever it declares (issue "What a careful
reviewer finds", item 4): an explicit example outside an implementation's declarations is moved onto
them (``Capabilities.project``), not dropped, so the empty batch, a missing ``key`` and the cache entries
past 2^31 elements reach an implementation that declares, say, float16 only or one latent width.

Planted adapters, each declaring away the values of today's fixed cases (their dtypes; the large MLA
case's latent width 12 and fp8 cache): a rope that raises on an empty batch, a rope that raises when
``key`` is None, and an MLA cache write whose addresses wrap at 2^31 elements (nightly: it fills 4 GiB).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ADAPTERS = '''
import torch
from mla_fuse_reference import ops
from mla_fuse_reference.adapter import ReferenceImplementation

FLOAT16 = {"dtypes": ("float16",)}


class RopeOnly(ReferenceImplementation):
    concat_and_cache_mla = concat_and_cache_mla_rope_fused = None
    reshape_and_cache_flash = rope_and_reshape_and_cache_flash = None
    capabilities = {"rotary_embedding": FLOAT16}


class EmptyBatchRaises(RopeOnly):
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if positions.numel() == 0:
            raise RuntimeError("grid of 0 programs")
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class NoKeyRaises(RopeOnly):
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        key.view(-1)  # AttributeError when key is None
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class WrapsPast2To31(ReferenceImplementation):
    """The MLA write with each entry's element offset computed in int32: past 2^31 it wraps."""
    rotary_embedding = concat_and_cache_mla_rope_fused = None
    reshape_and_cache_flash = rope_and_reshape_and_cache_flash = None
    capabilities = {"concat_and_cache_mla": {"dtypes": ("float16",), "kv_cache_dtypes": ("auto",),
                                             "latent_dims": (16,)}}

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        written = ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
        flat, block_size = kv_cache.view(-1), kv_cache.size(1)
        for slot in slot_mapping.tolist():
            if slot >= 0:
                block, entry = divmod(slot, block_size)
                offset = block * kv_cache.stride(0) + entry * kv_cache.stride(1)
                wrapped = (offset + 2 ** 31) % 2 ** 32 - 2 ** 31  # int32 arithmetic
                flat[wrapped % flat.numel():][:kv_cache.size(2)].copy_(written[block, entry])
'''


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "degenerate_adapters.py").write_text(ADAPTERS)
    return tmp_path


def _pytest(user_dir, adapter: str, module: str, select: str, profile: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST") and key != "CI"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "--tb=line", "--pyargs",
                           f"mla_fuse_conformance.properties.{module}", f"--mla-fuse-impl=degenerate_adapters:{adapter}",
                           f"--hypothesis-profile=mla_fuse.{profile}", "-k", select],
                          cwd=user_dir, env=dict(env, PYTHONPATH=str(user_dir),
                                                 MLA_FUSE_FAILURE_DIR=str(user_dir / "failures")),
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("adapter, raised", [("EmptyBatchRaises", "RuntimeError: grid of 0 programs"),
                                             ("NoKeyRaises", "AttributeError")])
def test_the_empty_batch_and_a_missing_key_reach_a_float16_only_rope(user_dir, adapter, raised):
    done = _pytest(user_dir, adapter, "test_rotary_embedding", "test_rotary_embedding_matches_reference", "dev")
    assert "1 failed" in done.stdout and raised in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    found = "tokens 0" if adapter == "EmptyBatchRaises" else "key none"
    assert found in done.stdout, done.stdout[-3000:]
    assert "dtype float16" in done.stdout


def test_the_reference_passes_where_they_fail(user_dir):
    done = _pytest(user_dir, "RopeOnly", "test_rotary_embedding", "test_rotary_embedding_matches_reference", "dev")
    assert "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.nightly
def test_entries_past_2_to_31_reach_a_write_declaring_another_width_and_format(user_dir):
    """The large MLA case (latent 12, fp8) moved onto the declarations (latent 16, ``auto``, float16): the
    wrapped write lands elsewhere, and the entries past 2^31 elements are not written."""
    done = _pytest(user_dir, "WrapsPast2To31", "test_large_addresses", "test_cache_entries_past_the_threshold",
                   "ci")
    assert "1 failed" in done.stdout and "kv_cache: entries past 2147549184 elements differ" in done.stdout, \
        done.stdout[-3000:] + done.stderr[-2000:]
