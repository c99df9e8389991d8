"""The FlashInfer and SGLang adapters, without their libraries or a GPU.

What runs here: the clean failure when the library or the device is missing, the declarations,
the slot_mapping -> FlashInfer page-table conversion against FlashInfer's own address arithmetic,
the cache appends end to end through a CPU emulation of that arithmetic (compared with the
reference), and the refusals that must come before any kernel runs. The kernels themselves are
exercised only on a machine with a GPU and the libraries (``mla-fuse verify --impl flashinfer|sglang``).
"""

import importlib.machinery
import importlib.util
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_fuse_conformance.commands import cli
from mla_fuse_conformance.adapters import flashinfer, sglang
from mla_fuse_conformance.contract.implementation import OPERATIONS, describe, load_implementation
from mla_fuse_reference.adapter import ReferenceImplementation

ADAPTERS = {"flashinfer": (flashinfer.FlashInferImplementation, "flashinfer", "pip install flashinfer-python"),
            "sglang": (sglang.SglangImplementation, "sgl_kernel", "pip install sgl-kernel")}


# ---------------------------------------------------------------- missing library, missing device


def _pretend_installed(monkeypatch, installed: bool, module: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == module:
            return importlib.machinery.ModuleSpec(name, None) if installed else None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("spec", sorted(ADAPTERS))
def test_a_missing_library_fails_in_one_line_with_exit_status_2(spec, monkeypatch, capsys, tmp_path):
    _, module, hint = ADAPTERS[spec]
    _pretend_installed(monkeypatch, False, module)
    monkeypatch.setattr(sys, "path", list(sys.path))  # cli.main makes the current directory importable
    with pytest.raises(ValueError) as error:
        load_implementation(spec)
    assert "\n" not in str(error.value) and "not installed" in str(error.value) and hint in str(error.value)
    assert cli.main(["verify", "--impl", spec, "--report-dir", str(tmp_path)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "ImportError" in stderr and hint in stderr


@pytest.mark.parametrize("spec", sorted(ADAPTERS))
def test_no_cuda_device_fails_at_instantiation_before_importing(spec, monkeypatch):
    _, module, _ = ADAPTERS[spec]
    _pretend_installed(monkeypatch, True, module)  # a fake spec: importing it would raise ModuleNotFoundError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=f"RuntimeError: {module} needs a CUDA device"):
        load_implementation(spec)


# ---------------------------------------------------------------- declarations


@pytest.mark.parametrize("spec, operations", [
    ("flashinfer", OPERATIONS),
    ("sglang", ("rotary_embedding", "concat_and_cache_mla_rope_fused", "rope_and_reshape_and_cache_flash")),
])
def test_declarations_are_valid(spec, operations):
    cls = ADAPTERS[spec][0]
    impl = describe(object.__new__(cls), spec)  # the declarations, without the library
    assert impl.operations == operations and not impl.near_misses
    assert (impl.name, impl.rounding, impl.padded_rows, impl.checks_inputs) == (spec, "single", "rotated", False)
    for operation in operations:
        assert impl.caps(operation).restrictions(), f"{spec} {operation}: no limit declared"


# ---------------------------------------------------------------- slot_mapping -> FlashInfer page table


def flashinfer_addresses(batch_indices, positions, kv_indices, kv_indptr, block_size):
    """(page, entry) of each token with batch >= 0, as FlashInfer computes it (include/flashinfer/page.cuh,
    AppendPagedKVCacheKernel: divmod(indptr[batch] * page_size + position, page_size); page = indices[...])."""
    out = {}
    for token, (batch, position) in enumerate(zip(batch_indices.tolist(), positions.tolist())):
        if batch >= 0:
            page_iter, entry = divmod(int(kv_indptr[batch]) * block_size + position, block_size)
            assert page_iter < int(kv_indptr[batch + 1]), "past the request's pages"
            out[token] = (int(kv_indices[page_iter]), entry)
    return out


@st.composite
def slot_mappings(draw):
    num_blocks, block_size = draw(st.integers(1, 6)), draw(st.sampled_from((1, 3, 16)))
    tokens = draw(st.integers(0, 12))
    length = draw(st.integers(0, tokens))
    slots = draw(st.lists(st.integers(-1, num_blocks * block_size - 1), min_size=length, max_size=length))
    dtype, stride = draw(st.sampled_from((torch.int64, torch.int32))), draw(st.sampled_from((1, 2)))
    parent = torch.full((max(length * stride, 1),), -7, dtype=dtype)
    slot_mapping = parent[::stride][:length]
    slot_mapping.copy_(torch.tensor(slots, dtype=dtype))
    return num_blocks, block_size, tokens, slot_mapping


@settings(max_examples=200, deadline=None)
@given(slot_mappings())
def test_each_written_slot_lands_at_its_block_and_offset(drawn):
    num_blocks, block_size, tokens, slot_mapping = drawn
    kv_indices, kv_indptr, last_page_len = flashinfer.single_sequence_page_table(num_blocks, block_size, "cpu")
    batch_indices, positions = flashinfer.slot_batch_positions(slot_mapping, tokens)
    assert batch_indices.dtype == positions.dtype == torch.int32 and batch_indices.shape == (tokens,)
    expected = {t: divmod(s, block_size) for t, s in enumerate(slot_mapping.tolist()) if s >= 0}
    assert flashinfer_addresses(batch_indices, positions, kv_indices, kv_indptr, block_size) == expected
    assert last_page_len.tolist() == [block_size]  # the one request fills all its pages (get_seq_lens)
    kept_batch, kept_positions, kept_rows = flashinfer.written_rows(batch_indices, positions, torch.arange(tokens))
    assert kept_rows.tolist() == sorted(expected) and (kept_batch == 0).all()
    assert kept_positions.tolist() == [slot_mapping[t].item() for t in sorted(expected)]


def test_written_rows_passes_tensors_through_when_every_row_is_written():
    key = torch.randn(4, 6)[:, ::2]  # strided: must reach the kernel as it is
    batch_indices, positions = flashinfer.slot_batch_positions(torch.tensor([3, 0, 7, 1]), 4)
    assert flashinfer.written_rows(batch_indices, positions, key)[2] is key


def test_a_cache_too_large_for_int32_positions_is_refused():
    with pytest.raises(NotImplementedError, match="int32"):
        flashinfer.single_sequence_page_table(2 ** 21, 2 ** 10, "cpu")


# ---------------------------------------------------------------- the cache appends through an emulated kernel


class EmulatedPage:
    """flashinfer.page's appends on CPU: FlashInfer's address arithmetic (page.cuh), every given row written."""

    @staticmethod
    def _append(rows_and_caches, batch_indices, positions, kv_indices, kv_indptr):
        block_size = rows_and_caches[0][1].shape[1]
        addresses = flashinfer_addresses(batch_indices, positions, kv_indices, kv_indptr, block_size)
        assert len(addresses) == len(batch_indices), "the plain appends skip no row: none may have batch -1"
        for token, (page, entry) in addresses.items():
            for rows, cache in rows_and_caches:
                cache[page, entry] = rows[token]

    def append_paged_mla_kv_cache(self, ckv, kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices,
                                  kv_indptr, kv_last_page_len):
        self._append([(ckv, ckv_cache), (kpe, kpe_cache)], batch_indices, positions, kv_indices, kv_indptr)

    def append_paged_kv_cache(self, key, value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
                              kv_last_page_len, kv_layout):
        assert kv_layout == "NHD"  # the logical [NB, B, Hkv, D] view, strides from the tensors
        key_cache, value_cache = paged_kv_cache
        self._append([(key, key_cache), (value, value_cache)], batch_indices, positions, kv_indices, kv_indptr)


def _emulated_flashinfer():
    impl = object.__new__(flashinfer.FlashInferImplementation)
    impl._page = EmulatedPage()
    return impl


SLOTS = [torch.tensor([5, -1, 0, 11]), torch.tensor([2, 9]), torch.tensor([-1, -1, -1, -1])]


@pytest.mark.parametrize("slot_mapping", SLOTS, ids=["padded", "short", "all padded"])
@pytest.mark.parametrize("hnd", [False, True], ids=["NHD", "HND"])
def test_reshape_and_cache_flash_matches_the_reference(slot_mapping, hnd):
    key, value = torch.randn(4, 2, 8, dtype=torch.bfloat16), torch.randn(4, 2, 8, dtype=torch.bfloat16)
    caches = []
    for _ in range(2):
        cache = torch.randn(3, 2, 4, 8, dtype=torch.bfloat16)  # [NB, Hkv, B, D] in memory when HND
        caches.append(cache.permute(0, 2, 1, 3) if hnd else cache.reshape(3, 4, 2, 8))
    expected = [cache.clone() for cache in caches]
    scale = torch.ones(1)
    ReferenceImplementation().reshape_and_cache_flash(key, value, *expected, slot_mapping, "auto", scale, scale)
    _emulated_flashinfer().reshape_and_cache_flash(key, value, *caches, slot_mapping, "auto", scale, scale)
    for actual, wanted in zip(caches, expected):
        assert torch.equal(actual, wanted)


@pytest.mark.parametrize("slot_mapping", SLOTS, ids=["padded", "short", "all padded"])
def test_concat_and_cache_mla_matches_the_reference(slot_mapping):
    kv = torch.randn(4, 7 + 4, dtype=torch.float16)  # one projection: kv_c and k_pe are column slices
    kv_cache = torch.randn(3, 4, 7 + 4 + 2, dtype=torch.float16)[..., :7 + 4]  # a view into a wider pool
    expected = kv_cache.clone()
    ReferenceImplementation().concat_and_cache_mla(kv[:, :7], kv[:, 7:], expected, slot_mapping, "auto",
                                                   torch.ones(1))
    _emulated_flashinfer().concat_and_cache_mla(kv[:, :7], kv[:, 7:], kv_cache, slot_mapping, "auto", torch.ones(1))
    assert torch.equal(kv_cache, expected)


# ---------------------------------------------------------------- refusals come before any kernel


class Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"the library was called ({name}) although the adapter should refuse first")


def _without_library(cls, **attributes):
    impl = object.__new__(cls)
    for name in ("_rope", "_page", "_kernels", "_elementwise"):
        setattr(impl, name, Untouchable())
    for name, value in attributes.items():
        setattr(impl, name, value)
    return impl


# FlashInfer's own tests of these ops (tests/attention/test_rope.py: test_rope_cos_sin_cache and
# test_generalized_rope_quantize_append_kv_cache) pass, so none of their sizes may be refused.
FLASHINFER_TESTED_ROPE = [(64, 64, True), (256, 128, True), (64, 32, True), (64, 64, False), (256, 128, False),
                          (192, 128, True), (80, 64, False), (112, 64, True), (160, 96, False)]
FLASHINFER_TESTED_FUSED = [(64, 512), (128, 256), (64, 128), (32, 96), (64, 64), (128, 128), (128, 0), (64, 0)]


def test_sizes_flashinfer_tests_itself_are_accepted():
    for head_size, rotary_dim, is_neox in FLASHINFER_TESTED_ROPE:
        assert flashinfer.rope_size_problem(head_size, rotary_dim, is_neox) is None
    for rotary_dim, nope_dim in FLASHINFER_TESTED_FUSED:
        assert flashinfer.fused_size_problem(rotary_dim, nope_dim, is_neox=False) is None


@pytest.mark.parametrize("head_size, rotary_dim, is_neox", [(64, 8, True), (64, 4, False), (80, 16, True),
                                                            (40, 8, False), (512, 16, True)])
def test_rope_sizes_whose_vectors_straddle_the_rotary_part_are_refused(head_size, rotary_dim, is_neox):
    impl = _without_library(flashinfer.FlashInferImplementation)
    query = torch.zeros(2, 1, head_size, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=f"rotary_dim {rotary_dim} is not a multiple"):
        impl.rotary_embedding(torch.zeros(2, dtype=torch.int64), query, query.clone(), head_size,
                              torch.zeros(4, rotary_dim), is_neox)


def _flash_args(kv_cache_dtype="fp8", k_scale=1.0, v_scale=1.0, slots=(0, 1), head_size=64, rotary_dim=64):
    tokens = len(slots)
    query, key, value = (torch.zeros(tokens, 1, head_size, dtype=torch.bfloat16) for _ in range(3))
    caches = [torch.zeros(2, 4, 1, head_size, dtype=torch.uint8) for _ in range(2)]
    return (torch.zeros(tokens, dtype=torch.int64), query, key, value, *caches, torch.tensor(slots),
            torch.zeros(8, rotary_dim), False, kv_cache_dtype, torch.tensor([k_scale]), torch.tensor([v_scale]))


@pytest.mark.parametrize("spec, args, message", [
    ("flashinfer", _flash_args(k_scale=0.5, v_scale=0.25), "k_scale and v_scale differ"),
    ("flashinfer", _flash_args(kv_cache_dtype="auto"), "fp8 caches only"),
    ("flashinfer", _flash_args(head_size=80, rotary_dim=32), "not a multiple of rotary_dim 32"),
    ("sglang", _flash_args(kv_cache_dtype="fp8"), "copies the source bits"),
    ("sglang", _flash_args(kv_cache_dtype="auto", slots=(0, -1)), "no padding slot"),
], ids=["one scale", "fp8 only", "nope chunks", "no fp8", "no padding"])
def test_fused_flash_refuses_what_the_api_cannot_express(spec, args, message):
    with pytest.raises(NotImplementedError, match=message):
        _without_library(ADAPTERS[spec][0]).rope_and_reshape_and_cache_flash(*args)


def test_plain_appends_refuse_fp8():
    impl = _without_library(flashinfer.FlashInferImplementation)
    kv_cache = torch.zeros(2, 4, 3, dtype=torch.uint8)
    with pytest.raises(NotImplementedError, match="copies the source bits"):
        impl.concat_and_cache_mla(torch.zeros(2, 1), torch.zeros(2, 2), kv_cache, torch.tensor([0, 1]), "fp8",
                                  torch.ones(1))


def _mla_args(scale=1.0, slots=(0, 1), kv_cache_dtype="fp8", rotary_dim=64, latent=512):
    tokens = len(slots)
    kv = torch.zeros(tokens, latent + rotary_dim, dtype=torch.bfloat16)
    return (torch.zeros(tokens, dtype=torch.int64), torch.zeros(tokens, 2, rotary_dim, dtype=torch.bfloat16),
            kv[:, latent:], kv[:, :latent], torch.zeros(8, rotary_dim), False, torch.tensor(slots),
            torch.zeros(2, 4, latent + rotary_dim, dtype=torch.uint8), kv_cache_dtype, torch.tensor([scale]))


@pytest.mark.parametrize("args, message", [
    (_mla_args(scale=0.5), "applies no scale"),
    (_mla_args(slots=(0, -1)), "no padding slot"),
    (_mla_args(kv_cache_dtype="fp8_e5m2"), "E4M3 only"),
], ids=["scale", "padding", "e5m2"])
def test_sglang_fused_mla_refuses_what_the_kernel_cannot_express(args, message):
    with pytest.raises(NotImplementedError, match=message):
        _without_library(sglang.SglangImplementation).concat_and_cache_mla_rope_fused(*args)


def test_sglang_token_rows_alias_the_cache_or_are_refused():
    cache = torch.zeros(3, 4, 2, 8)
    rows = sglang.token_rows(cache)
    rows[4 * 2 + 3] = 1.0  # slot 11 = block 2, entry 3
    assert cache[2, 3].eq(1).all() and cache.sum() == 16
    with pytest.raises(NotImplementedError, match="token rows"):
        sglang.token_rows(torch.zeros(3, 2, 4, 8).permute(0, 2, 1, 3))  # HND


def test_sglang_refuses_misaligned_rows_only_on_the_vectorized_path():
    kv = torch.zeros(4, 2 * (8 + 4) + 1, dtype=torch.bfloat16)[:, 1:]  # odd offset: 2-byte aligned rows
    q_pe = torch.zeros(4, 2, 4, dtype=torch.bfloat16)
    assert "not 4-byte aligned" in sglang.misaligned_pairs_problem(False, q_pe, kv[:, :8], kv[:, 8:12])
    assert sglang.misaligned_pairs_problem(True, q_pe, kv[:, :8], kv[:, 8:12]) is None  # NeoX: scalar kernel
    aligned = torch.zeros(4, 12, dtype=torch.bfloat16)
    assert sglang.misaligned_pairs_problem(False, q_pe, aligned[:, :8], aligned[:, 8:]) is None
