"""FlagGems' Triton kernels through ``--impl flaggems`` (``property_tests/adapters/flaggems.py``;
docs/THIRD_PARTY.md is the report).

Fixed cases of each operation against the reference; under Triton's interpreter, that the exact fp8
conversion (``running/interpreter_corrections.py``, shared with vllm-triton) is needed and hides no planted
kernel bug; the declared limits. A few seconds under the interpreter.

Where FlagGems comes from: ``$MLA_FUSE_FLAGGEMS_PATH`` (a directory an unpacked flag-gems wheel was unzipped
into), else the installed package, else ``$MLA_FUSE_FLAGGEMS_WHEEL`` (a wheel file, unzipped here into a
temporary directory); otherwise the tests are skipped. The wheel is pure Python and is never imported, so
none of its pinned dependencies is needed.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from mla_fuse.kernels import INTERPRETED
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import ops as ref
from third_party_helpers import DEVICE, adapter_loader, randn

PATH_ENV_VAR, WHEEL_ENV_VAR = "MLA_FUSE_FLAGGEMS_PATH", "MLA_FUSE_FLAGGEMS_WHEEL"
SENTINEL = 0x5A
# values whose fp8 E4M3 code the interpreter's own conversion gets wrong (triton-lang/triton#8322)
KNOWN = [1.0625, 464.0, 500.0, -1000.0, float("nan"), 3 * 2.0 ** -10, 1.0, -0.0, 0.3]


@pytest.fixture(scope="module")
def flaggems_root(third_party_root):
    """The directory ``${PATH_ENV_VAR}`` is to name (None: the installed package)."""
    return third_party_root("flag_gems", PATH_ENV_VAR, WHEEL_ENV_VAR, "FlagGems", "flag-gems==5.0.2")


@pytest.fixture
def flaggems(flaggems_root, monkeypatch):
    """A loader of the adapter: ``flaggems(sources=None, **attributes)``."""
    from mla_fuse_conformance.adapters.flaggems import FlagGemsImplementation

    return adapter_loader(FlagGemsImplementation, flaggems_root, PATH_ENV_VAR, monkeypatch, "sources")




def _bits(tensor):
    return tensor.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[tensor.element_size()])


def _within_bound(got, want, inputs):
    """CONTRACT §5's rope bound, loosened by the reference's own rounding: |got - want| <= 2 ulp(want) +
    2^-21 * max|input| (cos and sin are at most 1 in magnitude)."""
    eps = torch.finfo(got.dtype).eps
    bound = 2 * eps * want.double().abs() + 2.0 ** -21 * inputs.double().abs().max()
    return bool(((got.double() - want.double()).abs() <= bound).all())


@pytest.mark.parametrize("dtype, heads, kv_heads, head_size, rotary_dim, is_neox, rank", [
    (torch.bfloat16, 4, 2, 64, 64, True, 3),
    (torch.float16, 2, 1, 128, 64, False, 3),  # partial rotary: the tail passes through
    (torch.float32, 3, 3, 80, 48, True, 2),  # [T, H * D], R not a power of two
])
def test_rotary_embedding_fixed_cases(flaggems, dtype, heads, kv_heads, head_size, rotary_dim, is_neox, rank):
    impl = flaggems()
    tokens = 5
    query = randn(tokens, heads, head_size, dtype=dtype, seed=1)
    key = randn(tokens, kv_heads, head_size, dtype=dtype, seed=2)
    if rank == 2:
        query, key = query.reshape(tokens, -1), key.reshape(tokens, -1)
    angles = torch.arange(32, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, rotary_dim, 2) / rotary_dim)
    table = torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(DEVICE)
    positions = torch.tensor([0, 31, 7, 7, 12], device=DEVICE)
    query_in, key_in = query.clone(), key.clone()
    want_q, want_k = ref.rotary_embedding(positions, query, key, head_size, table, is_neox)
    impl.rotary_embedding(positions, query, key, head_size, table, is_neox)
    for name, got, want, before in (("query", query, want_q, query_in), ("key", key, want_k, key_in)):
        got, want = got.reshape(tokens, -1, head_size), want.reshape(tokens, -1, head_size)
        assert torch.equal(_bits(got[..., rotary_dim:]), _bits(want[..., rotary_dim:])), f"{name}: tail changed"
        assert _within_bound(got[..., :rotary_dim], want[..., :rotary_dim], before), f"{name}: past the bound"


# the contract's fp8 names -> FlagGems' own (its kv_dtype_map): a caller of flag_gems itself may pass these;
# vLLM passes the contract's (its CacheDType), which FlagGems refuses (test_vllms_fp8_names_are_refused)
FLAGGEMS_SPELLING = {"fp8_e4m3": "fp8e4m3", "fp8_e5m2": "fp8e5m2"}


def _mla(impl, kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim, slots, scale):
    kv_c = randn(len(slots) + 1, latent, dtype=dtype, seed=3)
    k_pe = randn(len(slots) + 1, rotary_dim, dtype=dtype, seed=4)
    shape = (3, 4, latent + rotary_dim)
    cache = (torch.full(shape, SENTINEL, dtype=torch.uint8, device=DEVICE).view(cache_dtype)
             if cache_dtype.itemsize == 1 else torch.full(shape, 7.0, dtype=cache_dtype, device=DEVICE))
    slots = torch.tensor(slots, device=DEVICE)
    scale = torch.tensor([scale], device=DEVICE)
    want = ref.concat_and_cache_mla(kv_c, k_pe, cache.clone(), slots, kv_cache_dtype, scale)
    impl.concat_and_cache_mla(kv_c, k_pe, cache, slots, FLAGGEMS_SPELLING.get(kv_cache_dtype, kv_cache_dtype), scale)
    return _bits(cache), _bits(want)


@pytest.mark.parametrize("kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim", [
    ("auto", torch.bfloat16, torch.bfloat16, 512, 64),  # DeepSeek's sizes
    ("fp8", torch.bfloat16, torch.uint8, 32, 16),
    ("fp8_e4m3", torch.float16, torch.uint8, 16, 32),  # R > L: the rope part in several blocks
    ("fp8_e5m2", torch.float32, torch.uint8, 8, 4),
])
def test_concat_and_cache_mla_fixed_cases(flaggems, kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim):
    got, want = _mla(flaggems(), kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim, [3, -1, 0, 9], 0.75)
    assert torch.equal(got, want), f"{(got != want).sum().item()} cache elements differ from the reference"


@pytest.mark.parametrize("dtype, kv_cache_dtype, heads, head_size, slots", [
    (torch.bfloat16, "auto", 2, 64, [3, -1, 0, 13, 6]),
    (torch.float16, "float16", 3, 40, [5, 1]),  # slot_mapping shorter than the tokens
])
def test_reshape_and_cache_flash_fixed_cases(flaggems, dtype, kv_cache_dtype, heads, head_size, slots):
    impl = flaggems()
    key = randn(len(slots) + 1, heads, head_size, dtype=dtype, seed=5)
    value = randn(len(slots) + 1, heads, head_size, dtype=dtype, seed=6)
    caches = [torch.full((4, 4, heads, head_size), 7.0, dtype=dtype, device=DEVICE) for _ in range(2)]
    slots = torch.tensor(slots, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    want = ref.reshape_and_cache_flash(key, value, caches[0].clone(), caches[1].clone(), slots, kv_cache_dtype, one,
                                       one)
    impl.reshape_and_cache_flash(key, value, *caches, slots, kv_cache_dtype, one, one)
    for name, got, expected in zip(("key_cache", "value_cache"), caches, want):
        assert torch.equal(_bits(got), _bits(expected)), f"{name} differs from the reference"


def test_the_declared_limits_are_the_codes(flaggems):
    caps = flaggems().capabilities
    assert caps["rotary_embedding"].describe(True) == ["key: not none", "tokens: not 0"]
    assert caps["concat_and_cache_mla"].describe(False) == [
        "slot_mapping layout: not strided", "kv_cache_dtype: not float32, bfloat16, float16, fp8_e4m3, fp8_e5m2",
        "fp8 storage: not float8", "latent width: only 1, 2, 4, 8, 16, 32, 64, 128, 256, 512"]
    assert caps["reshape_and_cache_flash"].describe(False) == [
        "slot_mapping layout: not strided", "head stride: not other", "value head size: not Dv != D",
        "kv_cache_dtype: not fp8, fp8_e4m3, fp8_e5m2"]
    assert set(flaggems().guarded_by_caller["reshape_and_cache_flash"]) == {"slot_mapping layout strided",
                                                                           "head stride other"}


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_vllms_fp8_names_are_refused_before_anything_is_written(flaggems, kv_cache_dtype):
    """Called as FlagGems' vLLM patch calls it (vLLM's ``CacheDType`` unchanged), the MLA write refuses
    vLLM's own names of the fp8 formats: a vLLM deployment with ``--kv-cache-dtype fp8_e4m3`` fails there
    (a served deployment, ``SERVES``). Before, the adapter translated the names, which the patch does not."""
    cache = torch.full((3, 4, 12), SENTINEL, dtype=torch.uint8, device=DEVICE)
    kv_c, k_pe = randn(2, 8, dtype=torch.bfloat16, seed=3), randn(2, 4, dtype=torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match=f"Unsupported kv_cache_dtype: {kv_cache_dtype}"):
        flaggems().concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([3, 0], device=DEVICE), kv_cache_dtype,
                                        torch.ones(1, device=DEVICE))
    assert (cache == SENTINEL).all()


UPSTREAM = pathlib.Path(__file__).parents[1] / "docs" / "upstream"


@pytest.mark.nightly  # two fresh interpreters each (~10 s here); the defects themselves are checked per change
@pytest.mark.parametrize("script", ["flaggems-mla-fp8-cache-dtype-names.py", "flaggems-flash-cache-entry-stride.py"])
def test_the_upstream_reproducer_exits_1_on_the_defect_and_0_with_reference(flaggems_root, script):
    """The confirmed defects' standalone reproducers in docs/upstream/ (torch, triton and FlagGems' files; no
    mla_fuse): vLLM's ``fp8_e4m3`` refused by the MLA write (``test_vllms_fp8_names_are_refused_...``), and the
    flash write's entry stride (``test_flash_cache_entries_are_written_as_if_packed``)."""
    path = ["--path", flaggems_root] if flaggems_root else []
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    for extra, code in (([], 1), (["--reference"], 0)):
        result = subprocess.run([sys.executable, str(UPSTREAM / script), *path, *extra], capture_output=True,
                                text=True, env=env, timeout=300)
        assert result.returncode == code, result.stdout + result.stderr
        assert ("DEFECT:" if code else "OK:") in result.stdout, result.stdout


def test_the_flash_write_raises_after_writing_fp8_as_the_patch_does(flaggems):
    """The patch's ``FlashAttentionImpl.forward`` raises NotImplementedError for fp8 after the write, which
    ignores the format: the cache is already written (the limit's check finds it ``unguarded: stray write``)."""
    caches = [torch.zeros(4, 4, 2, 64, dtype=torch.uint8, device=DEVICE) for _ in range(2)]
    key = randn(1, 2, 64, dtype=torch.bfloat16, seed=5)
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(NotImplementedError, match="FP8 quantization is not yet supported"):
        flaggems().reshape_and_cache_flash(key, key.clone(), *caches, torch.tensor([5], device=DEVICE), "fp8", one, one)
    assert caches[0].any(), "nothing was written before the raise"


@pytest.mark.skipif(not INTERPRETED, reason="the exact fp8 conversion applies under Triton's interpreter only")
def test_the_interpreters_own_fp8_cast_is_wrong_and_the_exact_one_is_the_contracts(flaggems):
    kv_c = torch.tensor(KNOWN, dtype=torch.float32)[:, None].expand(-1, 8).contiguous()
    k_pe = kv_c[:, :4].contiguous()
    want = ref_fp8.quantize(kv_c, torch.tensor(1.0), "e4m3")
    for exact in (False, True):
        cache = torch.zeros(len(KNOWN), 1, 12, dtype=torch.uint8)
        flaggems(exact_fp8_store=exact).concat_and_cache_mla(kv_c, k_pe, cache, torch.arange(len(KNOWN)), "fp8",
                                                             torch.ones(1))
        wrong = int((cache[:, 0, :8] != want).any(dim=1).sum())
        assert (wrong == 0) if exact else (wrong >= 4), (exact, cache[:, 0, 0].tolist(), want[:, 0].tolist())


@pytest.mark.skipif(not INTERPRETED, reason="the exact fp8 conversion applies under Triton's interpreter only")
def test_the_exact_cast_hides_no_kernel_bug(flaggems, flaggems_root):
    """A planted bug (the E5M2 branch multiplies by the scale) still fails with the exact conversion on."""
    from mla_fuse_conformance.adapters.flaggems import MLA_FILE, package_dir

    source = (package_dir() / MLA_FILE).read_text()
    planted = source.replace("val = (val / scale_val).to(tl.float8e5)", "val = (val * scale_val).to(tl.float8e5)")
    assert planted != source, "the kernel no longer divides by the scale in its E5M2 branch: update the planted bug"
    impl = flaggems(sources={MLA_FILE: planted})
    got, want = _mla(impl, "fp8_e5m2", torch.bfloat16, torch.uint8, 8, 4, [3, 0], 2.0)
    assert not torch.equal(got, want), "a kernel that multiplies by the scale passed"
    got, want = _mla(impl, "fp8_e4m3", torch.bfloat16, torch.uint8, 8, 4, [3, 0], 2.0)
    assert torch.equal(got, want), "the E4M3 branch was not planted and must still match"


def test_flash_cache_entries_are_written_as_if_packed(flaggems):
    """Confirmed defect (CONTRACT §2, the cache's entry stride): the kernel writes slot s of block b at
    ``b * block_stride + s * H * D``, reading no entry or head stride. Caches whose entries are packed
    (vLLM's flash layout ``[2, NB, B, H, D]``, K and V by ``unbind(0)``) are written right; K and V
    interleaved per entry (``[NB, B, 2, H, D]``, entry stride 2 * H * D) are written at the wrong places.
    Plain torch and the kernel, exact values."""
    impl = flaggems()
    heads, size = 2, 8
    key = (torch.arange(3 * heads * size, dtype=torch.float32, device=DEVICE) + 1).reshape(3, heads, size)
    one = torch.ones(1, device=DEVICE)
    packed = torch.zeros(2, 2, 4, heads, size, device=DEVICE)
    interleaved = torch.zeros(2, 4, 2, heads, size, device=DEVICE)
    for pool, (k, v), right in ((packed, packed.unbind(0), True), (interleaved, interleaved.unbind(2), False)):
        impl.reshape_and_cache_flash(key, -key, k, v, torch.tensor([1, 6, 3], device=DEVICE), "auto", one, one)
        assert torch.equal(k[0, 1], key[0]) == right and torch.equal(v[1, 2], -key[1]) == right, k.stride()


def test_flash_heads_are_read_as_if_packed(flaggems):
    """The declared ``head stride: other`` limit, guarded by vLLM's caller (``GUARDED_BY_CALLER``): the kernel reads a
    token's key at ``token * key.stride(0) + h * D + d`` (fused/reshape_and_cache_flash.py:42), so a key whose head
    stride is not D (each head a slice of a wider row) is read wrong, head 1 taken from right after head 0; one whose
    token stride alone is wider (a column slice of a qkv projection viewed ``[T, Hkv, D]``, as vLLM's attention
    layer passes it) is read right. Plain torch and the kernel, exact values."""
    impl = flaggems()
    tokens, heads, size = 3, 2, 4
    parent = (torch.arange(tokens * heads * (size + 3), dtype=torch.float32, device=DEVICE) + 1).reshape(
        tokens, heads, size + 3)
    one = torch.ones(1, device=DEVICE)
    sliced = parent[:, :, :size]  # head stride 7: not packed
    column = parent.reshape(tokens, -1)[:, :heads * size].reshape(tokens, heads, size)  # head stride 4, token 14
    for key, right in ((sliced, False), (column, True)):
        caches = [torch.zeros(1, 4, heads, size, device=DEVICE) for _ in range(2)]
        impl.reshape_and_cache_flash(key, key, *caches, torch.tensor([0, 1, 2], device=DEVICE), "auto", one, one)
        assert torch.equal(caches[0][0, :tokens], key) == right, (key.stride(), caches[0][0, :tokens])
        if not right:  # head 1 of token 0 read at offset 4: the 4 elements after head 0, not head 1's start (7)
            assert caches[0][0, 0, 1].tolist() == parent.flatten()[4:8].tolist()


def test_mla_fuse_verify_runs_it_on_one_models_deployments(flaggems_root, verify_one_deployment):
    """The suite's own run of the adapter: the flash write's entry-stride defect (K and V in one pool)
    fails Llama's flash-write deployments that interleave K and V; its rope calls pass."""
    code, report = verify_one_deployment("flaggems", **({PATH_ENV_VAR: flaggems_root} if flaggems_root else {}))
    failing = {entry["operation"] for entry in report["deployments"] if entry["verdict"] == "fail"}
    assert code == 1 and failing == {"reshape_and_cache_flash"}, report["deployments"]
    assert any(entry["verdict"] == "pass" for entry in report["deployments"]), report["deployments"]
