"""SGLang 0.5.23's Triton cache writes through ``--impl sglang-triton`` (``property_tests/adapters/sglang_triton.py``;
docs/THIRD_PARTY.md is the report); the reserved padding slot it declares is tests/test_slot_declarations.py's.

Fixed cases against the reference; the mapping of the contract's case onto SGLang's form (token rows, padded
tokens at slot 0); the interpreter correction the MLA kernel needs (an integer mask) shown needed and hiding
no planted bug; a planted bug in each loaded kernel caught; and the fused flash kernel's reading past a short
slot_mapping, checked by hand. Seconds under the interpreter.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from mla_fuse.kernels import INTERPRETED
from mla_fuse_reference import ops as ref
from third_party_helpers import DEVICE, assert_cited_lines_hold, bits, randn, rope_table, sentinel_filled

PATH_ENV_VAR, WHEEL_ENV_VAR = "MLA_FUSE_SGLANG_PATH", "MLA_FUSE_SGLANG_WHEEL"
MLA_FILE = "kernels/ops/kvcache/mla_buffer.py"
FUSED_FILE = "kernels/ops/attention/fused_qk_rope_reshape_and_cache.py"


@pytest.fixture(scope="module")
def sglang_root(third_party_root):
    """The directory ``${PATH_ENV_VAR}`` is to name (None: the installed package)."""
    return third_party_root("sglang", PATH_ENV_VAR, WHEEL_ENV_VAR, "SGLang", "sglang==0.5.23")


@pytest.fixture
def sglang(sglang_root, monkeypatch):
    """A loader of the adapter: ``sglang(sources=None)``."""
    if sglang_root is not None:
        monkeypatch.setenv(PATH_ENV_VAR, sglang_root)
    from mla_fuse_conformance.adapters.sglang_triton import SglangTritonImplementation

    return SglangTritonImplementation


def _within_bound(got, want, inputs):
    """CONTRACT §5's rope bound, loosened by the reference's own rounding (as tests/test_flaggems.py)."""
    eps = torch.finfo(got.dtype).eps
    bound = 2 * eps * want.double().abs() + 2.0 ** -21 * inputs.double().abs().max()
    return bool(((got.double() - want.double()).abs() <= bound).all())


def _no_padding(slots):
    """SGLang's padded slot 0 as the contract's -1: what the reference is to write."""
    return torch.where(slots == 0, -1, slots)


# ---------------------------------------------------------------- loading


def test_loading_imports_nothing_of_sglang_and_changes_no_setting(sglang):
    environ = dict(os.environ)
    impl = sglang()
    assert not any(name == "sglang" or name.startswith("sglang.") for name in sys.modules)
    assert dict(os.environ) == environ
    assert impl.version == "sglang 0.5.23", impl.version


# ---------------------------------------------------------------- concat_and_cache_mla


def _mla(impl, kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim, slots, blocks=5, block_size=2):
    tokens = len(slots)
    kv_c, k_pe = randn(tokens, latent, dtype=dtype, seed=1), randn(tokens, rotary_dim, dtype=dtype, seed=2)
    shape = (blocks, block_size, latent + rotary_dim)
    cache = sentinel_filled(shape, cache_dtype)
    slots = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    one = torch.ones(1, dtype=torch.float32, device=DEVICE)
    expected = ref.concat_and_cache_mla(kv_c, k_pe, cache.clone(), _no_padding(slots), kv_cache_dtype, one)
    impl.concat_and_cache_mla(kv_c, k_pe, cache, slots, kv_cache_dtype, one)
    return bits(cache), bits(expected)


@pytest.mark.parametrize("kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim", [
    ("auto", torch.bfloat16, torch.bfloat16, 16, 8),
    ("float16", torch.float16, torch.float16, 24, 8),  # L + R = 32: BLOCK 32
    ("auto", torch.float32, torch.float32, 20, 6),  # BLOCK 32 > L + R: the mask
    ("fp8", torch.bfloat16, torch.uint8, 160, 32),  # the fp8 kernel's BLOCK 128 spans latent and rope
    ("fp8_e4m3", torch.float16, torch.float8_e4m3fn, 8, 4),
])
def test_concat_and_cache_mla_fixed_cases(sglang, kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim):
    """Bit for bit the reference, padded tokens at SGLang's slot 0, whose row keeps its sentinel."""
    got, want = _mla(sglang(), kv_cache_dtype, dtype, cache_dtype, latent, rotary_dim, [3, 0, 9, 0, 4])
    assert torch.equal(got, want)
    assert bool((got[0, 0] == want[0, 0]).all())  # slot 0: untouched (the kernel skips reserved_skip_index)


def test_a_contract_cache_is_sglangs_token_rows(sglang):
    """The mapping by hand: slot s of ``[NB, B, L + R]`` is row s of SGLang's ``[NB * B, 1, L + R]`` pool, the
    entry ``[kv_c | k_pe]``; a cache with no token-row view is refused before anything is written."""
    impl = sglang()
    kv_c, k_pe = randn(2, 4, dtype=torch.float32, seed=3), randn(2, 2, dtype=torch.float32, seed=4)
    cache = torch.zeros(3, 2, 6, device=DEVICE)
    impl.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([5, 2], device=DEVICE), "auto", torch.ones(1))
    assert torch.equal(cache[2, 1], torch.cat([kv_c[0], k_pe[0]])) and torch.equal(cache[1, 0],
                                                                                    torch.cat([kv_c[1], k_pe[1]]))
    gapped = torch.zeros(3, 3, 6, device=DEVICE)[:, :2]  # block stride 3 entries, B = 2
    with pytest.raises(NotImplementedError, match="token rows"):
        impl.concat_and_cache_mla(kv_c, k_pe, gapped, torch.tensor([5, 2], device=DEVICE), "auto", torch.ones(1))
    assert not gapped.any()


# ---------------------------------------------------------------- rope_and_reshape_and_cache_flash


def _table(positions, width, dtype=torch.float32):
    inverse = 1.0 / (10000.0 ** (torch.arange(0, width, 2, dtype=torch.float64) / width))
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inverse)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype).to(DEVICE)


def _flash(impl, dtype, heads, kv_heads, head_size, is_neox, slots, kv_cache_dtype="auto", scale=1.0):
    tokens = len(slots)
    query = randn(tokens, heads, head_size, dtype=dtype, seed=5)
    key, value = randn(tokens, kv_heads, head_size, dtype=dtype, seed=6), randn(tokens, kv_heads, head_size,
                                                                                    dtype=dtype, seed=7)
    positions = torch.tensor([7, 0, 31, 12, 5][:tokens], device=DEVICE)
    table = _table(32, head_size)
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    caches = [sentinel_filled((5, 2, kv_heads, head_size), cache_dtype) for _ in range(2)]
    slots = torch.tensor(slots, device=DEVICE)
    scales = [torch.tensor([scale], device=DEVICE) for _ in range(2)]
    inputs = [query.clone(), key.clone()]
    want_q, want_k, want_kc, want_vc = ref.rope_and_reshape_and_cache_flash(
        positions, query.clone(), key.clone(), value, caches[0].clone(), caches[1].clone(), _no_padding(slots), table,
        is_neox, kv_cache_dtype, *scales)
    impl.rope_and_reshape_and_cache_flash(positions, query, key, value, *caches, slots, table, is_neox,
                                          kv_cache_dtype, *scales)
    return (query, key, *caches), (want_q, want_k, want_kc, want_vc), inputs


@pytest.mark.parametrize("dtype, heads, kv_heads, head_size, is_neox", [
    (torch.bfloat16, 4, 2, 16, True), (torch.float32, 2, 2, 8, False), (torch.float16, 3, 1, 32, True),
])
def test_fused_flash_fixed_cases(sglang, dtype, heads, kv_heads, head_size, is_neox):
    """q and k rotated in place within the rope bound, k and v at their slots; slot 0 (padding) not judged."""
    (q, k, kc, vc), (wq, wk, wkc, wvc), (q0, k0) = _flash(sglang(), dtype, heads, kv_heads, head_size, is_neox,
                                                          [4, 0, 9, 2])
    assert _within_bound(q, wq, q0) and _within_bound(k, wk, k0)
    written = torch.tensor([4, 9, 2])
    flat = lambda c: c.view(10, kv_heads, head_size)  # noqa: E731
    assert torch.equal(bits(flat(vc)[written]), bits(flat(wvc)[written]))
    assert torch.equal(bits(flat(kc)[written]), bits(k[[0, 2, 3]]))  # the cache holds what was written back
    unused = torch.tensor([1, 3, 5, 6, 7, 8])
    assert torch.equal(bits(flat(kc)[unused]), bits(flat(wkc)[unused]))


def test_fused_flash_fp8_codes_within_one(sglang):
    """fp8 with a scale: the kernel multiplies by ``1 / scale`` (fused_qk_rope_reshape_and_cache.py:372 and 424),
    so a code may differ by one at a rounding midpoint (CONTRACT §5 allows one there); every code here is within
    one of the reference's, with its sign."""
    (_, _, kc, vc), (_, _, wkc, wvc), _ = _flash(sglang(), torch.bfloat16, 2, 1, 16, True, [3, 6], "fp8", 3.0)
    for got, want in ((kc, wkc), (vc, wvc)):
        got, want = (c.view(10, 16)[[3, 6]].view(torch.uint8).int() for c in (got, want))
        assert torch.equal(got & 0x80, want & 0x80) and ((got & 0x7F) - (want & 0x7F)).abs().max() <= 1


def test_fused_flash_reads_past_a_short_slot_mapping(sglang):
    """A confirmed contract deviation (CONTRACT §2: rows past a short slot_mapping are rotated, never written),
    by hand: with 3 tokens and a 2-entry slot_mapping the kernel loads ``slot_mapping[2]`` (no ``pid_t < T_slot``
    check in its main path, fused_qk_rope_reshape_and_cache.py:329) and writes token 2 at whatever slot that
    memory holds. The docstring allows ``t_slot <= t``; SGLang itself passes as many slots as tokens."""
    impl = sglang()
    storage = torch.tensor([1, 2, 7], device=DEVICE)  # the third entry lies past the view
    slots = storage[:2]
    query, key, value = (randn(3, 1, 8, dtype=torch.float32, seed=s) for s in (8, 9, 10))
    caches = [torch.zeros(4, 2, 1, 8, device=DEVICE) for _ in range(2)]
    impl.rope_and_reshape_and_cache_flash(torch.tensor([1, 2, 3], device=DEVICE), query, key, value, *caches, slots,
                                          _table(8, 8), True, "auto", torch.ones(1), torch.ones(1))
    assert torch.equal(caches[1].view(8, 1, 8)[7], value[2])  # token 2 written at slot 7: a stray write


def test_a_strided_slot_mapping_is_read_as_contiguous(sglang):
    """A contract deviation SGLang's own callers never reach (its ``loc`` tensors are contiguous), by hand: the
    wrappers pass ``loc`` without its stride and the kernels read ``loc_ptr + pid_loc`` (mla_buffer.py:41,
    fused_qk_rope_reshape_and_cache.py:329), so a stride-2 view ``[5, 3]`` of ``[5, 6, 3, 7]`` writes token 1
    at slot 6."""
    impl = sglang()
    kv_c, k_pe = randn(2, 4, dtype=torch.float32, seed=11), randn(2, 2, dtype=torch.float32, seed=12)
    cache = torch.zeros(4, 2, 6, device=DEVICE)
    slots = torch.tensor([5, 6, 3, 7], device=DEVICE)[::2]
    impl.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.ones(1))
    rows = cache.view(8, 6)
    assert torch.equal(rows[5], torch.cat([kv_c[0], k_pe[0]])) and not rows[3].any()
    assert torch.equal(rows[6], torch.cat([kv_c[1], k_pe[1]]))


def test_a_query_whose_heads_are_not_packed_is_written_then_refused(sglang):
    """A contract deviation SGLang's own callers never reach (q, k, v are column slices of one projection), by
    hand: the wrapper's last line ``return q_out.view(-1, qh * d)`` (fused_qk_rope_reshape_and_cache.py:736)
    raises for a query whose head stride is not D, after the kernel rotated q and k and wrote the caches: an
    exception after the write (the limit check's ``stray write``), not a refusal."""
    impl = sglang()
    query = randn(2, 2, 5, dtype=torch.float32, seed=13)[..., :4]  # head stride 5, D = 4
    key, value = randn(2, 1, 4, dtype=torch.float32, seed=14), randn(2, 1, 4, dtype=torch.float32, seed=15)
    key_cache, value_cache = (torch.zeros(2, 2, 1, 4, device=DEVICE) for _ in range(2))
    before = query.clone()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        impl.rope_and_reshape_and_cache_flash(torch.tensor([1, 2], device=DEVICE), query, key, value, key_cache,
                                              value_cache, torch.tensor([1, 2], device=DEVICE),
                                              rope_table(4, torch.float32), True, "auto", torch.ones(1), torch.ones(1))
    assert not torch.equal(query, before)  # rotated in place
    assert torch.equal(value_cache.view(4, 4)[1:3], value.view(2, 4))  # and written


def test_the_fp8_cache_holds_the_fp32_rotation_not_the_written_back_key(sglang):
    """A confirmed contract deviation, by hand in torch: the fused kernel quantizes its fp32 rotation of k
    (``k_pe * k_scale_rcprl``, fused_qk_rope_reshape_and_cache.py:373) while it writes k back in bf16, so the fp8
    cache does not hold the code of the written-back key where the bf16 rounding lands on an fp8 tie (CONTRACT
    §2: the k stored is the rounded value written back; SGLang's unfused path quantizes the bf16 key). The case
    is the suite's large-address flash case (test_large_addresses.FLASH) inside the adapter's declarations."""
    from mla_fuse_conformance.cases import tensors
    from mla_fuse_conformance.properties.test_large_addresses import FLASH

    impl = sglang()
    case = impl.capabilities["rope_and_reshape_and_cache_flash"].project(FLASH, True)
    a = tensors.build(case, "cpu").args
    key, positions, table = a["key"].clone(), a["positions"].long(), a["cos_sin_cache"]
    impl.rope_and_reshape_and_cache_flash(*(a[n] for n in (
        "positions", "query", "key", "value", "key_cache", "value_cache", "slot_mapping", "cos_sin_cache", "is_neox",
        "kv_cache_dtype", "k_scale", "v_scale")))
    half = key.shape[-1] // 2  # NeoX, R = D, fp32 table, scale 1: x * cos + rotate(x) * sin in fp32
    cos, sin = (table[positions][:, None, part].float().repeat(1, 1, 2) for part in (slice(0, half), slice(half, None)))
    x = key.float()
    k32 = x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin
    token, slot = 1, int(a["slot_mapping"][1])
    got = a["key_cache"].view(-1, *a["key_cache"].shape[2:])[slot].view(torch.uint8)
    from_fp32 = k32[token].to(torch.float8_e4m3fn).view(torch.uint8)
    from_written_back = a["key"][token].float().to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(a["key"][token], k32[token].to(torch.bfloat16))  # the key written back: bf16(fp32 rotation)
    assert torch.equal(got, from_fp32) and not torch.equal(got, from_written_back)
    assert float(a["key"][token, 1, 0]) == -0.53125 and int(got[1, 0]) == 0xB1 and int(from_written_back[1, 0]) == 0xB0


def test_the_fp8_scale_is_applied_as_a_reciprocal(sglang):
    """A confirmed defect, by hand (docs/upstream/sglang-fused-qk-rope-fp8-scale-reciprocal.py is the standalone
    route): the fused kernel multiplies by ``1 / v_scale`` (fused_qk_rope_reshape_and_cache.py:424-425; 372-373 for
    k) where CONTRACT §3 and SGLang's unfused path (``cache_v.div_(v_scale)``, memory_pool.py:2926-2931) divide.
    float32 1.30624998 / 1.1 rounds to 1.1875, the midpoint of E4M3 1.125 and 1.25 (to even: 0x3a); the reciprocal
    product is one float32 step below it (0x39). Through the adapter, with the run's interpreter corrections."""
    impl = sglang()
    value = torch.zeros(1, 1, 8, dtype=torch.float32, device=DEVICE)
    value[0, 0, 0] = 1.306249976158142  # float32 0x3fa73333
    query, key = torch.zeros_like(value), torch.zeros_like(value)
    key_cache, value_cache = (torch.zeros(2, 1, 1, 8, dtype=torch.uint8, device=DEVICE) for _ in range(2))
    v_scale = torch.tensor([1.1], dtype=torch.float32, device=DEVICE)
    impl.rope_and_reshape_and_cache_flash(torch.tensor([0], device=DEVICE), query, key, value, key_cache, value_cache,
                                          torch.tensor([1], device=DEVICE), rope_table(8, torch.float32), True, "fp8",
                                          torch.ones(1, device=DEVICE), v_scale)
    quotient, product = value[0, 0, 0] / v_scale[0], value[0, 0, 0] * (1 / v_scale[0])
    assert float(quotient) == 1.1875 and float(product) < 1.1875  # the tie, and one float32 step below it
    want = ref.reshape_and_cache_flash(key, value, *(torch.zeros_like(c) for c in (key_cache, value_cache)),
                                       torch.tensor([1], device=DEVICE), "fp8", torch.ones(1, device=DEVICE), v_scale)
    assert int(want[1][1, 0, 0, 0]) == 0x3A == int(quotient.to(torch.float8_e4m3fn).view(torch.uint8))
    assert int(value_cache[1, 0, 0, 0]) == 0x39 == int(product.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(value_cache[1, 0, 0, 1:], want[1][1, 0, 0, 1:]) and not key_cache.any()


# ---------------------------------------------------------------- interpreter correction and planted kernels


@pytest.mark.skipif(not INTERPRETED, reason="an artifact of Triton's interpreter")
def test_the_mask_correction_is_needed(sglang, monkeypatch):
    """Without the run's comparison correction (``running/interpreter_corrections.py``) the interpreter raises
    ``mask has unsupported dtype`` on the MLA kernel (``mask & is_valid``)."""
    from mla_fuse_conformance.adapters import sglang_triton
    from mla_fuse_conformance.running.interpreter_corrections import uncorrected_interpreter

    monkeypatch.setattr(sglang_triton, "corrected_interpreter", uncorrected_interpreter)
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        _mla(sglang(), "auto", torch.bfloat16, torch.bfloat16, 16, 8, [3, 1])


@pytest.mark.skipif(not INTERPRETED, reason="an artifact of Triton's interpreter")
def test_the_language_helpers_must_be_interpreted(sglang, monkeypatch):
    """Where Triton was imported without ``TRITON_INTERPRET=1`` (``tl.flip`` a ``JITFunction``), the fused kernel
    cannot call ``tl.flip`` under the interpreter without ``interpreted_helpers``."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    from mla_fuse_conformance.adapters import sglang_triton

    if not isinstance(tl.flip, JITFunction):
        pytest.skip("Triton was imported with TRITON_INTERPRET=1: tl.flip is already interpreted")
    monkeypatch.setattr(sglang_triton, "interpreted_helpers", __import__("contextlib").nullcontext)
    with pytest.raises(Exception, match="outside of the scope of a kernel"):
        _flash(sglang(), torch.float32, 2, 1, 8, True, [4, 0])


PLANTED = {  # file -> (original text, planted text, a case that shows it)
    "mla": (MLA_FILE, "src = tl.where(is_nope, src_nope, src_rope)\n\n    tl.store(dst_ptr, src, mask=mask & is_valid)",
            "src = tl.where(is_nope, src_nope, src_nope)\n\n    tl.store(dst_ptr, src, mask=mask & is_valid)"),
    "mla_fp8": (MLA_FILE, "    # Destination pointer is FP8-typed view; tl.store performs downcast.\n    tl.store(dst_ptr, src,",
                "    # Destination pointer is FP8-typed view; tl.store performs downcast.\n    tl.store(dst_ptr, -src,"),
    "fused": (FUSED_FILE, "x_pe = x_pe * cos + x_pe_rotated * sin", "x_pe = x_pe * cos - x_pe_rotated * sin"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_in_each_kernel_fails_with_the_corrections(sglang, sglang_root, bug):
    from mla_fuse_conformance.adapters.sglang_triton import package_dir

    file, original, planted = PLANTED[bug]
    text = (package_dir() / file).read_text()
    assert text.count(original) == 1, f"{file} changed: the planted bug no longer applies"
    impl = sglang({file: text.replace(original, planted)})
    if bug == "fused":
        (q, k, *_), (wq, wk, *_), (q0, k0) = _flash(impl, torch.float32, 2, 1, 8, True, [4, 0, 9])
        assert not (_within_bound(q, wq, q0) and _within_bound(k, wk, k0))
    else:
        latent = 160 if bug == "mla_fp8" else 16  # the fp8 kernel's boundary block
        got, want = _mla(impl, "fp8" if bug == "mla_fp8" else "auto", torch.bfloat16,
                         torch.uint8 if bug == "mla_fp8" else torch.bfloat16, latent, 32 if bug == "mla_fp8" else 8,
                         [3, 0, 9])
        assert not torch.equal(got, want)


@pytest.mark.nightly  # two fresh interpreters each (~30 s here); each defect itself is checked per change above
@pytest.mark.parametrize("name", ["sglang-fused-qk-rope-short-slot-mapping.py",
                                  "sglang-fused-qk-rope-fp8-cache-from-unrounded-key.py",
                                  "sglang-fused-qk-rope-fp8-scale-reciprocal.py"])
def test_the_upstream_reproducer_exits_1_on_the_defect_and_0_with_reference(sglang_root, name):
    """docs/upstream's SGLang reproducers, standalone (torch, triton and the kernel file)."""
    import pathlib
    import subprocess

    script = pathlib.Path(__file__).parents[1] / "docs" / "upstream" / name
    path = ["--path", sglang_root] if sglang_root else []
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    for extra, code in (([], 1), (["--reference"], 0)):
        result = subprocess.run([sys.executable, str(script), *path, *extra], capture_output=True, text=True,
                                env=env, timeout=300)
        assert result.returncode == code, result.stdout + result.stderr


# each caller-guard citation of the adapter and what that line of SGLang 0.5.23 holds
GUARD_LINES = {"sglang/srt/mem_cache/allocator/token.py:61": "self.free_pages[:need_size]",
               "sglang/srt/mem_cache/allocator/paged.py:241": "out_indices = torch.empty(",
               "sglang/srt/model_executor/forward_batch_info.py:1722": "return torch.cat(",
               "sglang/srt/model_executor/forward_batch_info.py:1216": "torch.tensor(positions",
               "sglang/kernels/ops/attention/position.py:13": "positions = torch.empty(",
               "sglang/srt/models/gpt_oss.py:474": "q, k, v = qkv.split(",
               "sglang/srt/layers/rotary_embedding/base.py:493": "query = query.view(tokens, -1, qk_head_dim)",
               "sglang/srt/layers/rotary_embedding/base.py:119": "if not (_is_cuda or _is_hip",
               "sglang/srt/layers/rotary_embedding/base.py:210": "self.cos_sin_cache = self.cos_sin_cache.to(query.device)",
               "sglang/srt/layers/rotary_embedding/base.py:477": "if fused_set_kv_buffer_arg is not None and _is_hip:",
               "sglang/srt/layers/rotary_embedding/base.py:499": "cos_sin=self.cos_sin_cache,",
               "sglang/srt/layers/quantization/kv_cache.py:39": "layer.k_scale = torch.nn.Parameter(",
               "sglang/srt/layers/quantization/kv_cache.py:77": "Only support per-tensor scaling factor",
               "sglang/srt/models/utils.py:359": '"k_scale": layer.k_scale,'}


def test_the_caller_guards_cite_what_sglangs_lines_hold(sglang_root, monkeypatch):
    """Every ``path:line`` of ``GUARDED_BY_CALLER`` (the limits SGLang's callers never reach) is
    one of ``GUARD_LINES`` and holds its text in the wheel: a new or moved citation fails here."""
    from mla_fuse_conformance.adapters.sglang_triton import GUARDED_BY_CALLER, package_dir

    if sglang_root is not None:
        monkeypatch.setenv(PATH_ENV_VAR, sglang_root)
    assert_cited_lines_hold([GUARDED_BY_CALLER], "sglang", GUARD_LINES, package_dir().parent)


def test_mla_fuse_verify_runs_it_on_sglangs_own_deployment(sglang_root, verify_one_deployment):
    """The suite's own run of the adapter on SGLang's DeepSeek-V3 decode deployment (its MLA cache write, padded
    as SGLang pads: slot 0 reserved): PASS."""
    code, report = verify_one_deployment("sglang-triton", "in_deployment and deepseek-v3-tp1-bf16-sglang-decode",
                                         **({PATH_ENV_VAR: sglang_root} if sglang_root else {}))
    verdicts = {(entry["operation"], entry["verdict"]) for entry in report["deployments"]}
    assert code == 0 and verdicts == {("concat_and_cache_mla", "pass")}, report["deployments"]


def test_an_empty_batch_writes_nothing_as_sglang_does(sglang):
    """0 tokens: SGLang's ``_set_mla_kv_buffer_impl`` takes its no-rope branch (``cache_k_rope.numel() > 0`` is
    false), a launch of no program; the adapter refused it as "no rope part", a failure that was not SGLang's."""
    cache = torch.full((2, 4, 12), 7.0, dtype=torch.bfloat16, device=DEVICE)
    sglang().concat_and_cache_mla(torch.empty(0, 8, dtype=torch.bfloat16, device=DEVICE),
                                  torch.empty(0, 4, dtype=torch.bfloat16, device=DEVICE), cache,
                                  torch.empty(0, dtype=torch.int64, device=DEVICE), "auto", torch.ones(1, device=DEVICE))
    assert bool((cache == 7).all())
