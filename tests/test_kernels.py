"""The Triton kernels (``mla_fuse.ops``) against the float64 reference, with CONTRACT §5 comparisons.

* Rotated values: ``|impl - exact| <= ulp_out(exact) + 2^-22 * (|a*c| + |b*s|)``; the
  unrotated tail of a head bit for bit.
* Cache bytes: bit for bit what the reference writes (for fused ops, what the
  reference writes from the rotated values the kernel wrote back, CONTRACT §2),
  and fp8 codes within one step of the reference's fused result.
* Every tensor is a view into a larger sentinel-filled parent (storage offset,
  token/head/block strides, slices of one projection, HND caches); the whole
  parent is compared, so stray writes, writes to slot -1, to padded or unused
  slots, and writes landing in a copy all show.
* Fused == the unfused chain (``rotary_embedding`` then the cache write), bit for bit.

The ``tiling`` parameter also runs every case with small token and head blocks
(the GPU grid: several programs, partial tail blocks, head blocks > 0).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mla_fuse import ops
from mla_fuse.kernels import config
from mla_fuse_conformance.judging import comparisons
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import ops as ref_ops
from mla_fuse_reference import rope as ref_rope
from mla_fuse_reference.cache import FP8_FORMAT_OF_KV_CACHE_DTYPE

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
PARENT_PADDING = 5  # sentinel elements before and after every view's extent


# ---------------------------------------------------------------- tiling (interpreter vs GPU-like grids)


@pytest.fixture(params=["default", "small_blocks"])
def tiling(request, monkeypatch):
    """``small_blocks``: 2 tokens and 2 heads per program, as the GPU grid splits work."""
    if request.param == "small_blocks":
        monkeypatch.setattr(config, "token_block", lambda num_tokens, elements_per_token: 2)
        monkeypatch.setattr(config, "heads_per_program", lambda num_heads, elements_per_head: min(num_heads, 2))
    return request.param


# ---------------------------------------------------------------- sentinel-filled parents and views


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sentinel_parent(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A flat tensor of random bytes (never zeros): memory nothing may write."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(1, 256, (numel * size,), dtype=torch.uint8, generator=generator(seed))
    return raw.view(dtype).to(DEVICE)


def view_into(parent: torch.Tensor, size, stride, offset: int = PARENT_PADDING) -> torch.Tensor:
    return parent.as_strided(size, stride, offset)


def dense_view(shape, dtype, seed, order=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(parent, view): a view of ``shape`` laid out in dim ``order`` (outermost first) inside a sentinel parent."""
    order = order or list(range(len(shape)))
    stride, running = [0] * len(shape), 1
    for dim in reversed(order):
        stride[dim], running = running, running * shape[dim]
    parent = sentinel_parent(math.prod(shape) + 2 * PARENT_PADDING, dtype, seed)
    return parent, view_into(parent, shape, stride)


def fill_(view: torch.Tensor, seed: int, magnitude: float = 1.0) -> torch.Tensor:
    values = torch.randn(view.shape, generator=generator(seed), dtype=torch.float64) * magnitude
    view.copy_(values.to(view.dtype).to(view.device))
    return view


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF_SIZE[t.element_size()])


def same_view(parent_copy: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    return parent_copy.as_strided(view.size(), view.stride(), view.storage_offset())


def assert_parent_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    differs = bits(actual).cpu() != bits(expected).cpu()
    if differs.any():
        where = differs.nonzero().flatten()
        raise AssertionError(f"{what}: {where.numel()} of {differs.numel()} elements of the parent buffer differ "
                             f"bitwise, first at flat index {int(where[0])}")


# ---------------------------------------------------------------- CONTRACT §5 comparisons


def assert_rotated(actual: torch.Tensor, before: torch.Tensor, positions, cos_sin_cache, is_neox, what: str):
    """``actual [T, heads, D]``: first R elements within the bound of the exact rotation, the rest bitwise."""
    rotary_dim = cos_sin_cache.size(1)
    before, actual, positions, table = before.cpu(), actual.cpu(), positions.cpu(), cos_sin_cache.cpu()
    exact = ref_rope.rope_exact(positions, before, table, is_neox)[..., :rotary_dim]
    terms = comparisons.rotation_terms(positions, before, table, is_neox)
    bound = comparisons.rope_bound(exact, terms, actual.dtype, "single")
    error = (actual[..., :rotary_dim].to(torch.float64) - exact).abs()
    bad = ~(error <= bound)
    if bad.any():
        i = tuple(int(k) for k in bad.nonzero()[0])
        raise AssertionError(f"{what}: {int(bad.sum())} rotated values out of bound; at {i}: got "
                             f"{float(actual[..., :rotary_dim][i])!r}, exact {float(exact[i])!r}, "
                             f"bound {float(bound[i]):.3g}")
    tail_differs = bits(actual[..., rotary_dim:].contiguous()) != bits(before[..., rotary_dim:].contiguous())
    assert not tail_differs.any(), f"{what}: the unrotated tail changed"


def assert_codes_close(actual: torch.Tensor, expected: torch.Tensor, fmt: str, what: str) -> None:
    """fp8 codes as ordered integers within one step; NaN exactly where expected."""
    actual, expected = actual.view(torch.uint8).cpu(), expected.view(torch.uint8).cpu()
    actual_nan, expected_nan = comparisons.fp8_is_nan(actual, fmt), comparisons.fp8_is_nan(expected, fmt)
    distance = (comparisons.fp8_ordinal(actual) - comparisons.fp8_ordinal(expected)).abs()
    bad = (actual_nan != expected_nan) | (~expected_nan & (distance > 1))
    assert not bad.any(), f"{what}: {int(bad.sum())} fp8 codes more than one step from the reference"


# ---------------------------------------------------------------- inputs shared by the cases


def rope_inputs(num_tokens: int, rotary_dim: int, table_dtype: torch.dtype, position_dtype: torch.dtype,
                seed: int, yarn: bool = False):
    if yarn:  # DeepSeek YaRN table, positions near its end (large angles)
        table = ref_rope.deepseek_yarn_cos_sin_cache(rotary_dim, 2048, 10000.0, 8.0, mscale=1.0,
                                                     mscale_all_dim=1.0, dtype=table_dtype)
    else:
        table = ref_rope.plain_cos_sin_cache(rotary_dim, 4096, dtype=table_dtype)
    low = table.size(0) - 64 if yarn else 0
    positions = torch.randint(low, table.size(0), (num_tokens,), generator=generator(seed), dtype=torch.int64)
    return positions.to(position_dtype).to(DEVICE), table.to(DEVICE)


def slot_mapping(num_tokens: int, num_slots: int, num_padded: int, cache_slots: int, dtype, seed: int):
    """``num_slots`` distinct slots, ``num_padded`` of them -1, as the head of a ``num_tokens`` long buffer.

    The entries past the view are valid slots no token owns: a kernel reading ``slot_mapping``
    past its end writes there, and the cache's sentinel comparison shows it.
    """
    assert num_slots <= num_tokens <= cache_slots
    slots = torch.randperm(cache_slots, generator=generator(seed))[:num_tokens]
    slots[torch.randperm(num_slots, generator=generator(seed + 1))[:num_padded]] = -1
    return slots.to(dtype).to(DEVICE)[:num_slots]


def scale_tensor(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=DEVICE)


def cache_storage_dtype(kv_cache_dtype: str, cache_dtype: torch.dtype | None, dtype: torch.dtype) -> torch.dtype:
    if kv_cache_dtype in FP8_FORMAT_OF_KV_CACHE_DTYPE:
        return cache_dtype or torch.uint8
    return dtype


# ---------------------------------------------------------------- MLA


@dataclasses.dataclass(frozen=True)
class MlaCase:
    name: str
    dtype: torch.dtype = torch.bfloat16
    tokens: int = 9
    heads: int = 4
    latent: int = 32
    rotary: int = 16
    nope: int = 8
    blocks: int = 7
    block_size: int = 4
    kv_cache_dtype: str = "fp8"
    cache_dtype: torch.dtype | None = None  # fp8 caches: uint8 (None) or the float8 dtype
    is_neox: bool = False
    table_dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int64
    slots: int | None = None  # len(slot_mapping); None: one per token
    padded: int = 2
    scale: float = 0.37
    magnitude: float = 1.0
    yarn: bool = False


MLA_CASES = [
    MlaCase("deepseek_bf16_fp8_gptj"),
    MlaCase("decode_one_token_one_head_auto_neox", tokens=1, heads=1, kv_cache_dtype="auto", is_neox=True, padded=0),
    MlaCase("fp16_e5m2_float8_short_slot_mapping", dtype=torch.float16, tokens=11, slots=6, padded=1,
            kv_cache_dtype="fp8_e5m2", cache_dtype=torch.float8_e5m2, table_dtype=torch.float16,
            index_dtype=torch.int32, scale=2.5),
    MlaCase("fp32_auto_odd_sizes_neox", dtype=torch.float32, tokens=5, heads=3, latent=20, rotary=12, nope=0,
            block_size=3, kv_cache_dtype="auto", is_neox=True, padded=1),
    MlaCase("bf16_e4m3_float8_bf16_table_saturating", kv_cache_dtype="fp8_e4m3", cache_dtype=torch.float8_e4m3fn,
            table_dtype=torch.bfloat16, scale=2.0 ** -7, magnitude=3.0),
    MlaCase("named_bfloat16_cache_yarn_positions", kv_cache_dtype="bfloat16", yarn=True, rotary=32, padded=0),
]


def mla_inputs(case: MlaCase, seed: int = 0):
    t, h, l, r = case.tokens, case.heads, case.latent, case.rotary
    q_parent, q = dense_view((t, h, case.nope + r), case.dtype, seed)
    kv_parent, kv = dense_view((t, l + r), case.dtype, seed + 1)
    fill_(q, seed + 2, case.magnitude)
    fill_(kv, seed + 3, case.magnitude)
    cache_parent, cache = dense_view((case.blocks, case.block_size, l + r),
                                     cache_storage_dtype(case.kv_cache_dtype, case.cache_dtype, case.dtype), seed + 4)
    positions, table = rope_inputs(t, r, case.table_dtype, case.index_dtype, seed + 5, case.yarn)
    slots = slot_mapping(t, case.slots or t, case.padded, case.blocks * case.block_size, case.index_dtype, seed + 6)
    parents = {"q": q_parent, "kv": kv_parent, "kv_cache": cache_parent}
    views = dict(q_pe=q[..., case.nope:], kv_c=kv[:, :l], k_pe=kv[:, l:], kv_cache=cache, positions=positions,
                 cos_sin_cache=table, slot_mapping=slots, scale=scale_tensor([case.scale]))
    return parents, views


def clone_parents(parents):
    return {name: parent.clone() for name, parent in parents.items()}


@pytest.mark.parametrize("case", MLA_CASES, ids=lambda c: c.name)
def test_concat_and_cache_mla(case, tiling):
    parents, v = mla_inputs(case)
    before = clone_parents(parents)
    ops.concat_and_cache_mla(v["kv_c"], v["k_pe"], v["kv_cache"], v["slot_mapping"], case.kv_cache_dtype, v["scale"])

    expected = clone_parents(before)
    same_view(expected["kv_cache"], v["kv_cache"]).copy_(ref_ops.concat_and_cache_mla(
        v["kv_c"].cpu(), v["k_pe"].cpu(), same_view(before["kv_cache"], v["kv_cache"]).cpu(), v["slot_mapping"].cpu(),
        case.kv_cache_dtype, v["scale"].cpu()).to(DEVICE))
    for name in parents:
        assert_parent_bits(parents[name], expected[name], f"{case.name}: {name}")


@pytest.mark.parametrize("case", MLA_CASES, ids=lambda c: c.name)
def test_concat_and_cache_mla_rope_fused(case, tiling):
    parents, v = mla_inputs(case)
    before = clone_parents(parents)
    q_before, kv_before = same_view(before["q"], v["q_pe"]), same_view(before["kv"], v["k_pe"])
    ops.concat_and_cache_mla_rope_fused(v["positions"], v["q_pe"], v["k_pe"], v["kv_c"], v["cos_sin_cache"],
                                        case.is_neox, v["slot_mapping"], v["kv_cache"], case.kv_cache_dtype,
                                        v["scale"])
    # every row rotated (padded or past slot_mapping too), within the bound; nope part and kv_c untouched
    assert_rotated(v["q_pe"], q_before, v["positions"], v["cos_sin_cache"], case.is_neox, f"{case.name}: q_pe")
    assert_rotated(v["k_pe"][:, None, :], kv_before[:, None, :], v["positions"], v["cos_sin_cache"], case.is_neox,
                   f"{case.name}: k_pe")
    expected = clone_parents(before)
    same_view(expected["q"], v["q_pe"]).copy_(v["q_pe"])
    same_view(expected["kv"], v["k_pe"]).copy_(v["k_pe"])
    # the cache holds [kv_c | the rotated k_pe written back], stored as the reference stores them
    same_view(expected["kv_cache"], v["kv_cache"]).copy_(ref_ops.concat_and_cache_mla(
        v["kv_c"].cpu(), v["k_pe"].cpu(), same_view(before["kv_cache"], v["kv_cache"]).cpu(), v["slot_mapping"].cpu(),
        case.kv_cache_dtype, v["scale"].cpu()).to(DEVICE))
    for name in parents:
        assert_parent_bits(parents[name], expected[name], f"{case.name}: {name}")
    fmt = FP8_FORMAT_OF_KV_CACHE_DTYPE.get(case.kv_cache_dtype)
    if fmt is not None:  # and the codes are within one step of the reference's own fused result
        _, _, ref_cache = ref_ops.concat_and_cache_mla_rope_fused(
            v["positions"].cpu(), q_before.cpu(), kv_before.cpu(), v["kv_c"].cpu(), v["cos_sin_cache"].cpu(),
            case.is_neox, v["slot_mapping"].cpu(), same_view(before["kv_cache"], v["kv_cache"]).cpu(),
            case.kv_cache_dtype, v["scale"].cpu())
        assert_codes_close(v["kv_cache"], ref_cache, fmt, f"{case.name}: kv_cache vs the reference fused write")


@pytest.mark.parametrize("case", MLA_CASES[:3], ids=lambda c: c.name)
def test_mla_fused_equals_unfused_chain(case, tiling):
    fused_parents, f = mla_inputs(case)
    chain_parents, c = mla_inputs(case)
    ops.concat_and_cache_mla_rope_fused(f["positions"], f["q_pe"], f["k_pe"], f["kv_c"], f["cos_sin_cache"],
                                        case.is_neox, f["slot_mapping"], f["kv_cache"], case.kv_cache_dtype,
                                        f["scale"])
    ops.rotary_embedding(c["positions"], c["q_pe"], c["k_pe"], case.rotary, c["cos_sin_cache"], case.is_neox)
    ops.concat_and_cache_mla(c["kv_c"], c["k_pe"], c["kv_cache"], c["slot_mapping"], case.kv_cache_dtype, c["scale"])
    for name in fused_parents:
        assert_parent_bits(fused_parents[name], chain_parents[name], f"{case.name}: fused vs chain, {name}")


# ---------------------------------------------------------------- rotary_embedding


@dataclasses.dataclass(frozen=True)
class RopeCase:
    name: str
    dtype: torch.dtype = torch.bfloat16
    tokens: int = 7
    heads: int = 4
    kv_heads: int | None = 2  # None: key is None
    head_size: int = 32
    rotary: int = 32
    flat: bool = False  # [T, heads * head_size] instead of [T, heads, head_size]
    is_neox: bool = True
    table_dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int64


ROPE_CASES = [
    RopeCase("llama_bf16_neox_gqa"),
    RopeCase("gptj_fp16_partial_rotary_flat", dtype=torch.float16, head_size=24, rotary=16, flat=True,
             is_neox=False, table_dtype=torch.float16, index_dtype=torch.int32),
    RopeCase("query_only_fp32_one_token", dtype=torch.float32, tokens=1, heads=3, kv_heads=None, head_size=12,
             rotary=12, is_neox=False),
    RopeCase("odd_half_rotary_more_kv_heads", heads=2, kv_heads=5, head_size=20, rotary=12),
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: c.name)
def test_rotary_embedding(case, tiling):
    t, d = case.tokens, case.head_size
    # query and key: heads of one packed qkv row [T, (H + Hkv + Hkv) * D] (token stride > heads * D)
    kv_heads = case.kv_heads or 0
    parent, qkv = dense_view((t, (case.heads + 2 * kv_heads) * d), case.dtype, 10)
    fill_(qkv, 11)
    query = qkv[:, :case.heads * d]
    key = qkv[:, case.heads * d:(case.heads + kv_heads) * d] if case.kv_heads else None
    if not case.flat:
        query = query.unflatten(1, (case.heads, d))
        key = key.unflatten(1, (kv_heads, d)) if key is not None else None
    positions, table = rope_inputs(t, case.rotary, case.table_dtype, case.index_dtype, 12)
    before = parent.clone()
    ops.rotary_embedding(positions, query, key, d, table, case.is_neox)

    as_heads = lambda x: x.reshape(t, -1, d)  # noqa: E731
    assert_rotated(as_heads(query), as_heads(same_view(before, query)), positions, table, case.is_neox,
                   f"{case.name}: query")
    expected = before.clone()
    same_view(expected, query).copy_(query)
    if key is not None:
        assert_rotated(as_heads(key), as_heads(same_view(before, key)), positions, table, case.is_neox,
                       f"{case.name}: key")
        same_view(expected, key).copy_(key)
    assert_parent_bits(parent, expected, f"{case.name}: qkv parent (value heads, padding)")


# ---------------------------------------------------------------- flash (MHA)


@dataclasses.dataclass(frozen=True)
class FlashCase:
    name: str
    dtype: torch.dtype = torch.bfloat16
    tokens: int = 7
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 32
    value_head_size: int = 32
    rotary: int = 32
    blocks: int = 5
    block_size: int = 4
    kv_cache_dtype: str = "auto"
    cache_dtype: torch.dtype | None = None
    layout: str = "NHD"  # HND: the caches are [NB, Hkv, B, D] permuted to [NB, B, Hkv, D]
    is_neox: bool = True
    table_dtype: torch.dtype = torch.float32
    index_dtype: torch.dtype = torch.int64
    k_scale: tuple = (1.0,)
    v_scale: tuple = (1.0,)
    slots: int | None = None
    padded: int = 1


FLASH_CASES = [
    FlashCase("llama_bf16_auto_neox"),
    FlashCase("partial_rotary_fp8_per_head_scales_hnd", head_size=24, value_head_size=20, rotary=16,
              kv_cache_dtype="fp8", layout="HND", is_neox=False, k_scale=(0.5, 3.0), v_scale=(0.25,)),
    FlashCase("mqa_fp16_e5m2_float8_short_slot_mapping", dtype=torch.float16, heads=3, kv_heads=1,
              kv_cache_dtype="fp8_e5m2", cache_dtype=torch.float8_e5m2, tokens=9, slots=5, index_dtype=torch.int32,
              table_dtype=torch.float16, k_scale=(0.125,), v_scale=(2.0,)),
    FlashCase("fp32_gptj_odd_block_size", dtype=torch.float32, block_size=3, blocks=4, is_neox=False, head_size=16,
              value_head_size=8, rotary=8, padded=2),
    FlashCase("e4m3_float8_bf16_table_per_head", kv_cache_dtype="fp8_e4m3", cache_dtype=torch.float8_e4m3fn,
              table_dtype=torch.bfloat16, kv_heads=4, k_scale=(0.3, 0.7, 1.9, 0.05), v_scale=(0.6, 0.2, 1.0, 4.0)),
]


def flash_inputs(case: FlashCase, seed: int = 20):
    t, h, hkv, d, dv = case.tokens, case.heads, case.kv_heads, case.head_size, case.value_head_size
    q_parent, query = dense_view((t, h, d), case.dtype, seed)
    k_parent, key = dense_view((t, hkv, d), case.dtype, seed + 1, order=[1, 0, 2])  # head-major key
    v_parent, value = dense_view((t, hkv, dv), case.dtype, seed + 2)
    for i, x in enumerate((query, key, value)):
        fill_(x, seed + 3 + i)
    storage = cache_storage_dtype(case.kv_cache_dtype, case.cache_dtype, case.dtype)
    order = [0, 2, 1, 3] if case.layout == "HND" else None
    kc_parent, key_cache = dense_view((case.blocks, case.block_size, hkv, d), storage, seed + 6, order)
    vc_parent, value_cache = dense_view((case.blocks, case.block_size, hkv, dv), storage, seed + 7, order)
    positions, table = rope_inputs(t, case.rotary, case.table_dtype, case.index_dtype, seed + 8)
    slots = slot_mapping(t, case.slots or t, case.padded, case.blocks * case.block_size, case.index_dtype, seed + 9)
    parents = {"query": q_parent, "key": k_parent, "value": v_parent, "key_cache": kc_parent,
               "value_cache": vc_parent}
    views = dict(query=query, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                 positions=positions, cos_sin_cache=table, slot_mapping=slots, k_scale=scale_tensor(case.k_scale),
                 v_scale=scale_tensor(case.v_scale))
    return parents, views


def expected_flash_caches(case, v, before, key, expected):
    """Write what the reference stores for ``key`` (and the value) into the expected parents."""
    key_cache, value_cache = ref_ops.reshape_and_cache_flash(
        key.cpu(), v["value"].cpu(), same_view(before["key_cache"], v["key_cache"]).cpu(),
        same_view(before["value_cache"], v["value_cache"]).cpu(), v["slot_mapping"].cpu(), case.kv_cache_dtype,
        v["k_scale"].cpu(), v["v_scale"].cpu())
    same_view(expected["key_cache"], v["key_cache"]).copy_(key_cache.to(DEVICE))
    same_view(expected["value_cache"], v["value_cache"]).copy_(value_cache.to(DEVICE))


@pytest.mark.parametrize("case", FLASH_CASES, ids=lambda c: c.name)
def test_reshape_and_cache_flash(case, tiling):
    parents, v = flash_inputs(case)
    before = clone_parents(parents)
    ops.reshape_and_cache_flash(v["key"], v["value"], v["key_cache"], v["value_cache"], v["slot_mapping"],
                                case.kv_cache_dtype, v["k_scale"], v["v_scale"])
    expected = clone_parents(before)
    expected_flash_caches(case, v, before, v["key"], expected)
    for name in parents:
        assert_parent_bits(parents[name], expected[name], f"{case.name}: {name}")


@pytest.mark.parametrize("case", FLASH_CASES, ids=lambda c: c.name)
def test_rope_and_reshape_and_cache_flash(case, tiling):
    parents, v = flash_inputs(case)
    before = clone_parents(parents)
    query_before, key_before = same_view(before["query"], v["query"]), same_view(before["key"], v["key"])
    ops.rope_and_reshape_and_cache_flash(v["positions"], v["query"], v["key"], v["value"], v["key_cache"],
                                         v["value_cache"], v["slot_mapping"], v["cos_sin_cache"], case.is_neox,
                                         case.kv_cache_dtype, v["k_scale"], v["v_scale"])
    assert_rotated(v["query"], query_before, v["positions"], v["cos_sin_cache"], case.is_neox, f"{case.name}: query")
    assert_rotated(v["key"], key_before, v["positions"], v["cos_sin_cache"], case.is_neox, f"{case.name}: key")
    expected = clone_parents(before)
    same_view(expected["query"], v["query"]).copy_(v["query"])
    same_view(expected["key"], v["key"]).copy_(v["key"])
    expected_flash_caches(case, v, before, v["key"], expected)  # the rotated key written back, then stored
    for name in parents:
        assert_parent_bits(parents[name], expected[name], f"{case.name}: {name}")
    fmt = FP8_FORMAT_OF_KV_CACHE_DTYPE.get(case.kv_cache_dtype)
    if fmt is not None:
        _, _, ref_key_cache, _ = ref_ops.rope_and_reshape_and_cache_flash(
            v["positions"].cpu(), query_before.cpu(), key_before.cpu(), v["value"].cpu(),
            same_view(before["key_cache"], v["key_cache"]).cpu(),
            same_view(before["value_cache"], v["value_cache"]).cpu(), v["slot_mapping"].cpu(),
            v["cos_sin_cache"].cpu(), case.is_neox, case.kv_cache_dtype, v["k_scale"].cpu(), v["v_scale"].cpu())
        assert_codes_close(v["key_cache"], ref_key_cache, fmt, f"{case.name}: key_cache vs the reference fused write")


@pytest.mark.parametrize("case", FLASH_CASES[:3], ids=lambda c: c.name)
def test_flash_fused_equals_unfused_chain(case, tiling):
    fused_parents, f = flash_inputs(case)
    chain_parents, c = flash_inputs(case)
    ops.rope_and_reshape_and_cache_flash(f["positions"], f["query"], f["key"], f["value"], f["key_cache"],
                                         f["value_cache"], f["slot_mapping"], f["cos_sin_cache"], case.is_neox,
                                         case.kv_cache_dtype, f["k_scale"], f["v_scale"])
    ops.rotary_embedding(c["positions"], c["query"], c["key"], case.head_size, c["cos_sin_cache"], case.is_neox)
    ops.reshape_and_cache_flash(c["key"], c["value"], c["key_cache"], c["value_cache"], c["slot_mapping"],
                                case.kv_cache_dtype, c["k_scale"], c["v_scale"])
    for name in fused_parents:
        assert_parent_bits(fused_parents[name], chain_parents[name], f"{case.name}: fused vs chain, {name}")


# ---------------------------------------------------------------- special values and bad input


@pytest.mark.parametrize("kv_cache_dtype, fmt", [("fp8", "e4m3"), ("fp8_e5m2", "e5m2")])
def test_fp8_cache_special_values(kv_cache_dtype, fmt):
    """Saturation (finite max, inf), NaN (0x7F | sign), zeros and subnormals reach the cache exactly."""
    max_finite = ref_fp8.FORMATS[fmt].max_finite
    specials = torch.tensor([max_finite * 4, -max_finite * 4, float("inf"), -float("inf"), float("nan"),
                             -float("nan"), 0.0, -0.0, 2.0 ** -18, -(2.0 ** -17), 1.0, 3.0], dtype=torch.float32)
    kv = specials.repeat(2, 2).to(DEVICE)  # [2, 24]: kv_c = first 16 columns, k_pe = last 8
    cache = torch.zeros(2, 2, 24, dtype=torch.uint8, device=DEVICE)
    slots = torch.tensor([3, 0], device=DEVICE)
    scale = scale_tensor([0.5])
    ops.concat_and_cache_mla(kv[:, :16], kv[:, 16:], cache, slots, kv_cache_dtype, scale)
    expected = ref_ops.concat_and_cache_mla(kv[:, :16].cpu(), kv[:, 16:].cpu(), torch.zeros_like(cache.cpu()),
                                            slots.cpu(), kv_cache_dtype, scale.cpu())
    assert torch.equal(cache.cpu(), expected)
    max_code = 0x7E if fmt == "e4m3" else 0x7B
    assert cache[1, 1, :6].tolist() == [max_code, max_code | 0x80, max_code, max_code | 0x80, 0x7F, 0xFF]


def test_bad_input_raises_before_writing():
    _, v = mla_inputs(MlaCase("bad_input"))
    q_before, cache_before = v["q_pe"].clone(), v["kv_cache"].clone()
    with pytest.raises(ValueError, match="positions"):
        bad_positions = torch.full_like(v["positions"], 10 ** 6)
        ops.concat_and_cache_mla_rope_fused(bad_positions, v["q_pe"], v["k_pe"], v["kv_c"], v["cos_sin_cache"],
                                            False, v["slot_mapping"], v["kv_cache"], "fp8", v["scale"],
                                            check_values=True)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ops.concat_and_cache_mla(v["kv_c"], v["k_pe"], v["kv_cache"], v["slot_mapping"], "fp4", v["scale"])
    assert torch.equal(bits(v["q_pe"]), bits(q_before)) and torch.equal(v["kv_cache"], cache_before)


def test_empty_batches_write_nothing():
    _, v = mla_inputs(MlaCase("empty", tokens=3, padded=0))
    cache_before = v["kv_cache"].clone()
    empty = v["slot_mapping"][:0]
    ops.concat_and_cache_mla(v["kv_c"], v["k_pe"], v["kv_cache"], empty, "fp8", v["scale"])
    ops.concat_and_cache_mla_rope_fused(v["positions"][:0], v["q_pe"][:0], v["k_pe"][:0], v["kv_c"][:0],
                                        v["cos_sin_cache"], False, empty, v["kv_cache"], "fp8", v["scale"])
    assert torch.equal(v["kv_cache"], cache_before)
