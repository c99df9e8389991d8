"""LMDeploy 0.18.0's PyTorch-engine Triton kernels through ``--impl lmdeploy`` (``property_tests/adapters/lmdeploy.py``;
docs/THIRD_PARTY.md is the report).

Loading (nothing of LMDeploy imported); the mapping of the contract's slot mapping onto LMDeploy's step metadata
(sequences, history, block tables, padded entries at the reserved block 0), by hand; fixed cases of each
operation against the reference; a planted bug in each loaded kernel caught; LMDeploy's packed cache pool as
its layouts' cache form; the suite's own run on LMDeploy's own deployments (served); the confirmed defect (a NaN
stored in an fp8 cache as +-448) by its second routes, the GPU compile's PTX and (nightly) the standalone
reproducer. Seconds under the interpreter.
"""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from mla_fuse_conformance.adapters.lmdeploy import SERVES
from mla_fuse_conformance.cases.deployment_cases import deployments_running
from mla_fuse_conformance.cases.engine_caches import CacheLayout, MhaCacheSpec, MlaCacheSpec, build_caches
from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS
from mla_fuse_conformance.judging.comparisons import rope_bound, rotation_terms
from mla_fuse_reference import ops as ref
from third_party_helpers import DEVICE, adapter_loader, bits, randn, rope_table, sentinel_filled

PATH_ENV_VAR, WHEEL_ENV_VAR = "MLA_FUSE_LMDEPLOY_PATH", "MLA_FUSE_LMDEPLOY_WHEEL"
FILL_FILE = "pytorch/kernels/cuda/fill_kv_cache.py"
ROPE_FILE = "pytorch/kernels/cuda/apply_rotary_pos_emb.py"


@pytest.fixture(scope="module")
def lmdeploy_root(third_party_root):
    """The directory ``${PATH_ENV_VAR}`` is to name (None: the installed package)."""
    return third_party_root("lmdeploy", PATH_ENV_VAR, WHEEL_ENV_VAR, "LMDeploy", "lmdeploy==0.18.0",
                            only=("lmdeploy/messages.py", "lmdeploy/pytorch/kernels/cuda/",
                                  "lmdeploy-0.18.0.dist-info/"))


@pytest.fixture
def lmdeploy(lmdeploy_root, monkeypatch):
    """A loader of the adapter: ``lmdeploy(sources=None)``."""
    from mla_fuse_conformance.adapters.lmdeploy import LmdeployImplementation

    return adapter_loader(LmdeployImplementation, lmdeploy_root, PATH_ENV_VAR, monkeypatch, "sources")


def _no_padding(slots):
    """LMDeploy's padded slot 0 as the contract's -1: what the reference is to write."""
    return torch.where(slots == 0, -1, slots)


def _entries(cache):
    """``[NB, B, ...]`` as ``[NB * B, ...]`` bits, slot 0 (padding, not judged) dropped."""
    return bits(cache).reshape(-1, *cache.shape[2:])[1:]


# ---------------------------------------------------------------- loading and the mapping


def test_loading_imports_nothing_of_lmdeploy_and_changes_no_setting(lmdeploy):
    environ = dict(os.environ)
    impl = lmdeploy()
    assert not any(name == "lmdeploy" or name.startswith("lmdeploy.") for name in sys.modules)
    assert dict(os.environ) == environ
    assert impl.version == "lmdeploy 0.18.0", impl.version
    assert [int(p) for p in impl.functions["QuantPolicy"]] == [0, 4, 8, 16, 17, 42]  # messages.py:20-27


def test_a_slot_mapping_as_lmdeploys_sequences(lmdeploy_root, monkeypatch):
    """By hand, B = 4: slots 5..8 continue one run across blocks 1 -> 2 (history 1: entry 1 of its first block);
    slot 0 is a padded entry (q = kv = 1, block row 0, as a CUDA graph pads); 3 then 20 run from entry 3 of
    block 0 into block 5; 13 after 14 (not the next entry) starts a sequence; rows padded with 0; the longest
    run is max_q_seqlen."""
    from mla_fuse_conformance.adapters.lmdeploy import metadata_of

    assert metadata_of([5, 6, 7, 8, 0, 3, 20, 14, 13], 4) == {
        "q_start_loc": [0, 4, 5, 7, 8], "q_seqlens": [4, 1, 2, 1, 1], "kv_seqlens": [5, 1, 5, 3, 2],
        "block_offsets": [[1, 2], [0, 0], [0, 5], [3, 0], [3, 0]], "max_q_seqlen": 4}
    decode = metadata_of([9, 2, 30], 8)  # scattered slots: one token a sequence, the decode launch
    assert decode["q_seqlens"] == [1, 1, 1] and decode["max_q_seqlen"] == 1 and decode["kv_seqlens"] == [2, 3, 7]
    wrapped = metadata_of([6, 7, 4], 4)  # 4 after 7: entry 0 of block 1, already the sequence's: a new sequence
    assert wrapped["block_offsets"] == [[1], [1]] and wrapped["kv_seqlens"] == [4, 1]
    assert metadata_of([], 16) == {"q_start_loc": [], "q_seqlens": [], "kv_seqlens": [], "block_offsets": [],
                                   "max_q_seqlen": 0}
    with pytest.raises(NotImplementedError, match="no negative slot"):
        metadata_of([3, -1], 4)


def test_a_contract_mla_cache_is_lmdeploys_shared_kv_cache(lmdeploy):
    """Slot s of ``[NB, B, L + R]`` is block ``s // B`` entry ``s % B`` of LMDeploy's ``[NB, B, 1, L + R]`` cache,
    the entry ``[kv_c | k_pe]``; a view into a pool (block stride past the block) is written through its strides."""
    impl = lmdeploy()
    kv_c, k_pe = randn(3, 8, dtype=torch.float32, seed=1), randn(3, 4, dtype=torch.float32, seed=2)
    pool = torch.zeros(3, 20, 12, device=DEVICE)
    cache = pool[:, :16]  # block stride 20 entries, B = 16
    impl.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([17, 18, 40], device=DEVICE), "auto",
                              torch.ones(1, device=DEVICE))
    for token, (block, entry) in enumerate([(1, 1), (1, 2), (2, 8)]):
        assert torch.equal(cache[block, entry], torch.cat([kv_c[token], k_pe[token]]))
    assert int((pool != 0).any(-1).sum()) == 3
    before = pool.clone()
    with pytest.raises(NotImplementedError, match="no negative slot"):  # -1 has no form: refused, nothing written
        impl.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([5, -1, 6], device=DEVICE), "auto",
                                  torch.ones(1, device=DEVICE))
    assert torch.equal(pool, before)


# ---------------------------------------------------------------- cache writes against the reference


@pytest.mark.parametrize("kv_cache_dtype, dtype, cache_dtype, scale, slots", [
    ("auto", torch.bfloat16, torch.bfloat16, 1.0, [17, 0, 40, 18]),
    ("float16", torch.float16, torch.float16, 1.0, [20, 21, 22, 23, 24, 25]),  # prefill: one run across blocks
    ("fp8", torch.bfloat16, torch.uint8, 0.25, [33, 0, 70, 34]),
    ("fp8_e5m2", torch.float16, torch.float8_e5m2, 3.0, [5, 6, 90]),
])
def test_concat_and_cache_mla_fixed_cases(lmdeploy, kv_cache_dtype, dtype, cache_dtype, scale, slots):
    """Bit for bit the reference (fp8: its exact codes), every slot but the padded slot 0."""
    kv_c, k_pe = randn(len(slots), 24, dtype=dtype, seed=3), randn(len(slots), 8, dtype=dtype, seed=4)
    cache = sentinel_filled((6, 16, 32), cache_dtype)
    slots, scale = torch.tensor(slots, device=DEVICE), torch.tensor([scale], device=DEVICE)
    want = ref.concat_and_cache_mla(kv_c, k_pe, cache.clone(), _no_padding(slots), kv_cache_dtype, scale)
    lmdeploy().concat_and_cache_mla(kv_c, k_pe, cache, slots, kv_cache_dtype, scale)
    assert torch.equal(_entries(cache), _entries(want))


@pytest.mark.parametrize("kv_cache_dtype, cache_dtype, scales", [
    ("auto", torch.float16, (1.0, 1.0)), ("fp8_e4m3", torch.float8_e4m3fn, (0.5, 2.0)),
])
def test_reshape_and_cache_flash_fixed_cases(lmdeploy, kv_cache_dtype, cache_dtype, scales):
    """K and V (Dv != D) at their slots bit for bit, an HND view of the caches included (strides passed)."""
    slots = torch.tensor([19, 20, 0, 3], device=DEVICE)
    key, value = randn(4, 2, 16, dtype=torch.float16, seed=5), randn(4, 2, 8, dtype=torch.float16, seed=6)
    key_cache = sentinel_filled((4, 2, 16, 16), cache_dtype).transpose(1, 2)  # [NB, B, Hkv, D] viewed from HND
    value_cache = sentinel_filled((4, 16, 2, 8), cache_dtype)
    k_scale, v_scale = (torch.tensor([s], device=DEVICE) for s in scales)
    want_k, want_v = ref.reshape_and_cache_flash(key, value, key_cache.clone(), value_cache.clone(),
                                                 _no_padding(slots), kv_cache_dtype, k_scale, v_scale)
    lmdeploy().reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale)
    assert torch.equal(_entries(key_cache), _entries(want_k)) and torch.equal(_entries(value_cache), _entries(want_v))


def test_per_head_scales_are_refused_before_any_write(lmdeploy):
    """LMDeploy's fp8 scales are one value per layer (nn/attention.py:78-79): ``[Hkv]`` scales are refused."""
    caches = [sentinel_filled((2, 16, 2, 8), torch.float8_e4m3fn) for _ in range(2)]
    before = [bits(c).clone() for c in caches]
    with pytest.raises(NotImplementedError, match="one k_scale"):
        lmdeploy().reshape_and_cache_flash(randn(1, 2, 8, dtype=torch.float16, seed=7),
                                           randn(1, 2, 8, dtype=torch.float16, seed=8), *caches,
                                           torch.tensor([3], device=DEVICE), "fp8", torch.ones(2, device=DEVICE),
                                           torch.ones(2, device=DEVICE))
    assert all(torch.equal(bits(c), b) for c, b in zip(caches, before))


def test_no_token_to_write_is_a_batch_of_no_sequence(lmdeploy):
    """No token, or an empty ``slot_mapping`` for two tokens: a batch of no sequence, a launch of no program; the
    cache untouched. The rope runs an empty batch too (a launch of no program)."""
    cache = sentinel_filled((2, 16, 12), torch.bfloat16)
    no_slots = torch.empty(0, dtype=torch.int64, device=DEVICE)
    for tokens in (0, 2):
        kv_c, k_pe = (randn(tokens, width, dtype=torch.bfloat16, seed=13) for width in (8, 4))
        lmdeploy().concat_and_cache_mla(kv_c, k_pe, cache, no_slots, "auto", torch.ones(1, device=DEVICE))
    assert bool((cache == 7).all())
    query = torch.empty(0, 2, 8, device=DEVICE)
    lmdeploy().rotary_embedding(no_slots, query, query[:, :1], 8, rope_table(8, torch.float32), True)


# ---------------------------------------------------------------- rope


def _rope(impl, dtype, head_size, rotary_dim, is_neox, key_heads, rank=3):
    """``(got, exact, bound)`` of q (and k) after ``impl.rotary_embedding`` (CONTRACT §5, per_op)."""
    positions = torch.tensor([3, 0, 31, 7, 12], device=DEVICE)
    table = rope_table(rotary_dim, torch.float32)
    query = randn(5, 4, head_size, dtype=dtype, seed=9)
    key = randn(5, key_heads, head_size, dtype=dtype, seed=10) if key_heads else None
    pairs = [(query, query.clone())] + ([(key, key.clone())] if key is not None else [])
    exact = ref.rotary_embedding(positions, query.double(), None if key is None else key.double(), head_size,
                                 table.double(), is_neox)
    impl.rotary_embedding(positions, query.flatten(1) if rank == 2 else query,
                          None if key is None else (key.flatten(1) if rank == 2 else key), head_size, table, is_neox)
    results = []
    for (got, before), want in zip(pairs, exact):
        bound = rope_bound(want[..., :rotary_dim], rotation_terms(positions, before[..., :rotary_dim], table, is_neox),
                           dtype, "per_op")
        rotated_ok = bool(((got[..., :rotary_dim].double() - want[..., :rotary_dim]).abs() <= bound).all())
        results.append(rotated_ok and torch.equal(got[..., rotary_dim:], before[..., rotary_dim:]))
    return results


@pytest.mark.parametrize("dtype, head_size, rotary_dim, is_neox, key_heads, rank", [
    (torch.bfloat16, 32, 32, True, 2, 3), (torch.float16, 32, 16, False, 1, 3),  # GPT-J: complex_mode, partial
    (torch.float32, 24, 12, True, 0, 3),  # no key: forward_single of the rotary columns
    (torch.bfloat16, 16, 16, False, 2, 2),  # rank 2 [T, H * D] viewed as heads
])
def test_rotary_embedding_fixed_cases(lmdeploy, dtype, head_size, rotary_dim, is_neox, key_heads, rank):
    """q and k within the per_op bound; the tail past R unchanged bit for bit."""
    assert all(_rope(lmdeploy(), dtype, head_size, rotary_dim, is_neox, key_heads, rank))


# ---------------------------------------------------------------- planted bugs and the suite's own run


_FILL_STORE = ("    k = tl.load(ks_ptrs, mask=mask_ks)\n    if BLOCK_DV > 0:\n"
               "        v = tl.load(vs_ptrs, mask=mask_vs)\n"
               "    tl.store(kc_ptrs, {}k, mask=mask_kc)")  # the bf16 kernel's store (fill_kv_cache.py:130-133)
PLANTED = {  # bug -> (file, original text, planted text)
    "fill": (FILL_FILE, _FILL_STORE.format(""), _FILL_STORE.format("-")),
    "fp8": (FILL_FILE, "k = tl.load(ks_ptrs, mask=mask_ks).to(tl.float32) / k_scale",
            "k = tl.load(ks_ptrs, mask=mask_ks).to(tl.float32) * k_scale"),
    "rope": (ROPE_FILE, "return x_l_new0 - x_l_new1, x_h_new0 + x_h_new1",
             "return x_l_new0 + x_l_new1, x_h_new0 + x_h_new1"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_bug_in_each_kernel_is_caught(lmdeploy, bug):
    from mla_fuse_conformance.adapters.lmdeploy import package_dir

    file, original, planted = PLANTED[bug]
    text = (package_dir() / file).read_text()
    assert text.count(original) == 1, f"{file} changed: the planted bug no longer applies"
    impl = lmdeploy(sources={file: text.replace(original, planted)})
    if bug == "rope":
        assert not all(_rope(impl, torch.float32, 16, 16, True, 1))
        return
    kv_c, k_pe = randn(3, 24, dtype=torch.bfloat16, seed=11), randn(3, 8, dtype=torch.bfloat16, seed=12)
    cache, dtype_name = (sentinel_filled((4, 16, 32), torch.uint8), "fp8") if bug == "fp8" else (
        sentinel_filled((4, 16, 32), torch.bfloat16), "auto")
    slots, scale = torch.tensor([17, 18, 40], device=DEVICE), torch.tensor([0.5], device=DEVICE)
    want = ref.concat_and_cache_mla(kv_c, k_pe, cache.clone(), slots, dtype_name, scale)
    impl.concat_and_cache_mla(kv_c, k_pe, cache, slots, dtype_name, scale)
    assert not torch.equal(_entries(cache), _entries(want))


def test_mla_fuse_verify_passes_it_on_lmdeploys_own_deployments(lmdeploy_root, verify_one_deployment):
    """The suite's own run of the adapter on the deployments of LMDeploy's layouts (``SERVES``: run whatever is
    declared): DeepSeek-V3's bf16 MLA write, Llama's rope and flash write in bf16 and fp8: PASS."""
    code, report = verify_one_deployment("lmdeploy", "in_deployment and lmdeploy",
                                         **({PATH_ENV_VAR: lmdeploy_root} if lmdeploy_root else {}))
    verdicts = {(entry["name"], entry["operation"], entry["verdict"]) for entry in report["deployments"]}
    served = {(d.name, operation, "pass") for operation, layouts in SERVES.items()
              for d in deployments_running(operation) if d.layout in layouts}
    assert code == 0 and len(served) == 5 and verdicts == served, report["deployments"]


def test_it_serves_every_call_of_lmdeploys_layouts():
    """Each call of each LMDeploy layout (``declarations/lmdeploy_layouts.py``) is one the adapter serves, and it
    serves no other engine's: a layout's call added without the adapter standing in for it shows here."""
    calls = {(operation, layout.name) for layout in LAYOUTS.values() if layout.engine == "lmdeploy"
             for operation in layout.operations}
    assert calls == {(operation, name) for operation, names in SERVES.items() for name in names}


def _packed_pool(layers: int, blocks: int, descs: list[tuple[tuple[int, ...], torch.dtype]]) -> list[list]:
    """LMDeploy's ``PackedBlockCacheLayout.allocate`` (lmdeploy/pytorch/engine/cache_engine/layout.py:60-73) with
    ``CacheDesc``'s 256-byte alignment (lmdeploy/pytorch/engine/cache_engine/schema.py:37-42), its statements in
    order: per spec, the ``[layers, NB, *shape]`` view; then per layer ``[i]``, as the model runner hands each layer
    its caches."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in descs]
    aligned = [(size + 255) // 256 * 256 for size in sizes]
    pool_tensor = torch.zeros((layers, blocks, sum(aligned)), dtype=torch.uint8)
    views, offset = [], 0
    for (shape, dtype), size, step in zip(descs, sizes, aligned):
        cache = pool_tensor[:, :, offset:offset + size].view(dtype)
        views.append(cache.view((layers, blocks, *shape)))
        offset += step
    return [[view[i] for view in views] for i in range(layers)]


def _byte_geometry(view: torch.Tensor, pool: torch.Tensor) -> tuple:
    """Shape, byte strides and byte offset in its pool: what two layouts of one storage must agree on."""
    size = view.element_size()
    start = view.storage_offset() * size - pool.storage_offset() * pool.element_size()
    return tuple(view.shape), tuple(stride * size for stride in view.stride()), start


@pytest.mark.parametrize("layout_name, dtype", [("lmdeploy-flash", torch.bfloat16),
                                                ("lmdeploy-flash", torch.float8_e4m3fn),
                                                ("lmdeploy-mla", torch.bfloat16)])
def test_lmdeploys_packed_pool_is_its_layouts_cache_form(layout_name, dtype):
    """The cache form ``lmdeploy_layouts`` declares (``chunked``; K/V ``flashinfer`` for MHA), built by
    ``cases/engine_caches.py``, puts every layer's K and V at the bytes LMDeploy's packed pool does: one pool,
    layer ``i`` its ``[i]`` chunk, K then V in each block (Llama-3.1-8B's Hkv 8, D 128, at block 16), and
    DeepSeek's key cache ``[NB, B, 1, L + R]`` beside an empty V (v_head_dim 0)."""
    layers, blocks, block_size = 3, 5, 16
    form = LAYOUTS[layout_name].cache
    if form.kv:
        spec, descs = MhaCacheSpec(8, 128), [((block_size, 8, 128), dtype)] * 2
    else:
        spec, descs = MlaCacheSpec(576), [((block_size, 1, 576), dtype), ((block_size, 1, 0), dtype)]
    theirs = _packed_pool(layers, blocks, descs)
    ours = build_caches({f"layer{i}": spec for i in range(layers)}, CacheLayout(form.pool, form.kv or "flash",
                        form.hnd), blocks=blocks, block_size=block_size, dtype=dtype)
    assert len(ours.pools) == 1
    for (key, value), entry in zip(theirs, ours.layers.values()):
        pool = theirs[0][0]
        if form.kv:
            assert _byte_geometry(entry.key_cache, ours.pools[0]) == _byte_geometry(key, pool)
            assert _byte_geometry(entry.value_cache, ours.pools[0]) == _byte_geometry(value, pool)
        else:
            assert _byte_geometry(entry.kv_cache, ours.pools[0]) == _byte_geometry(key.squeeze(2), pool)
            assert value.numel() == 0


# ---------------------------------------------------------------- the confirmed defect: fp8 NaN stored as +-448


REPRODUCER = pathlib.Path(__file__).parents[1] / "docs" / "upstream" / "lmdeploy-fp8-cache-nan.py"
PTX_SCRIPT = pathlib.Path(__file__).parent / "data" / "lmdeploy_fp8_nan_ptx.py"


def _without_interpret():
    return {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}


def test_a_nan_is_clamped_to_a_finite_value_in_the_gpu_compile_too(lmdeploy):
    """The suite finds a NaN key stored as -448 under the interpreter (``max`` then ``min``). A GPU's compile
    (sm_90, built without a GPU) does not propagate it either: fill_kv_cache.py:216's ``tl.clamp`` is
    ``propagateNan = none`` and its PTX ``min.xorsign.abs.f32`` without ``.NaN`` (the other operand's magnitude);
    with ``propagate_nan=tl.PropagateNan.ALL`` (the upstream draft's fix) it is ``min.NaN.xorsign.abs.f32``."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's CUDA backend compiles the kernel")
    from mla_fuse_conformance.adapters.lmdeploy import package_dir

    for extra, clamp, minimum in (([], "propagateNan = none", "min.xorsign.abs.f32"),
                                  (["--fixed"], "propagateNan = all", "min.NaN.xorsign.abs.f32")):
        result = subprocess.run([sys.executable, str(PTX_SCRIPT), str(package_dir() / FILL_FILE), *extra],
                                capture_output=True, text=True, timeout=300, env=_without_interpret())
        assert result.returncode == 0, result.stderr[-2000:]
        lines = result.stdout.splitlines()
        assert "tt.clampf" in lines[0] and clamp in lines[0], lines
        assert [line.split()[0] for line in lines[1:]] == [minimum, "cvt.rn.satfinite.e4m3x2.f32"], lines


@pytest.mark.nightly  # two fresh interpreters; the defect itself is shown per change above (the GPU compile)
def test_the_upstream_reproducer_exits_1_on_the_defect_and_0_with_reference(lmdeploy_root):
    """docs/upstream/lmdeploy-fp8-cache-nan.py, standalone (torch, triton and the kernel file)."""
    path = ["--path", lmdeploy_root] if lmdeploy_root else []
    for extra, code in (([], 1), (["--reference"], 0)):
        result = subprocess.run([sys.executable, str(REPRODUCER), *path, *extra], capture_output=True, text=True,
                                env=_without_interpret(), timeout=300)
        assert result.returncode == code, result.stdout + result.stderr


# ---------------------------------------------------------------- the confirmed defect: rope token addresses in int32


ROPE_REPRODUCER = pathlib.Path(__file__).parents[1] / "docs" / "upstream" / "lmdeploy-rope-int32-offsets.py"
ROPE_TTIR = pathlib.Path(__file__).parent / "data" / "lmdeploy_rope_ttir.py"


def test_query_rows_2_31_elements_past_q_wrap_in_the_gpu_compile_too(lmdeploy):
    """The suite's ``test_query_rows_a_huge_stride_apart`` crashes its worker under the interpreter. A GPU's
    compile does the same arithmetic: the token stride is a ``tl.constexpr`` (apply_rotary_pos_emb.py:33), an
    ``i32`` constant when it fits, and line 87 ``Q + pos_offset * stride_qs`` an ``i32`` multiply feeding
    ``tt.addptr`` (the TTIR of a CUDA target, built without a GPU): 2 * (2^30 + 1) wraps to -2^31 + 2."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's CUDA backend builds the TTIR")
    from mla_fuse_conformance.adapters.lmdeploy import package_dir

    assert torch.tensor(2, dtype=torch.int32) * torch.tensor(2 ** 30 + 1, dtype=torch.int32) == -2 ** 31 + 2
    result = subprocess.run([sys.executable, str(ROPE_TTIR), str(package_dir() / ROPE_FILE)], capture_output=True,
                            text=True, timeout=300, env=_without_interpret())
    assert result.returncode == 0, result.stderr[-2000:]
    constant, product, pointer = result.stdout.splitlines()
    assert constant.endswith("arith.constant dense<1073741825> : tensor<16xi32>"), constant
    assert "arith.muli %pos_offset" in product and product.endswith(": tensor<16xi32>"), product
    assert "tt.addptr" in pointer and pointer.endswith("tensor<16xi32>"), pointer


@pytest.mark.nightly  # an interpreter over an 8 GiB buffer (pages touched only), twice
def test_the_rope_reproducer_exits_1_on_the_defect_and_0_with_reference(lmdeploy_root):
    """docs/upstream/lmdeploy-rope-int32-offsets.py, standalone (torch, triton and the kernel file)."""
    path = ["--path", lmdeploy_root] if lmdeploy_root else []
    for extra, code in (([], 1), (["--reference"], 0)):
        result = subprocess.run([sys.executable, str(ROPE_REPRODUCER), *path, *extra], capture_output=True,
                                text=True, env=_without_interpret(), timeout=300)
        assert result.returncode == code, result.stdout + result.stderr
