"""Addresses past 2^31 elements (BUGS.md: int32 overflow in address arithmetic).

A kernel that computes ``block * block_stride`` or ``token * token_stride`` in int32
writes to the wrong place once the product passes 2^31. These tests run one small
case twice: once on ordinary tensors (checked against the reference by the oracle),
once with the cache's entries in its last blocks past the threshold (or q rows
``token_stride`` apart), and require the same bits in the same entries and no other
byte changed. On a GPU the threshold is 2^31 elements (about 2 GiB per fp8 cache,
4 GiB for the bf16 q); on the CPU it is 2^20 elements, a smoke test of the same path.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from mla_fuse_conformance.cases import tensors as build
from mla_fuse_conformance.judging import comparisons
from mla_fuse_conformance.running import checks
from mla_fuse_conformance.cases import memory
from mla_fuse_conformance.judging import oracle
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase, SlotSpec, TableSpec

GPU_THRESHOLD = 2 ** 31 + 2 ** 16
CPU_THRESHOLD = 2 ** 20
FILL = 0x7FC1

MLA = MlaCase(seed=11, tokens=9, heads=2, latent=12, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="fp8_e4m3",
              num_blocks=3, block_size=4, slots=SlotSpec(9, padding="some", placement="extremes"),
              table=TableSpec("plain", 4, 64), cache_storage="uint8")
FLASH = FlashCase(seed=12, tokens=9, heads=4, kv_heads=2, head_size=8, value_head_size=8, dtype="bfloat16",
                  kv_cache_dtype="fp8_e4m3", num_blocks=3, block_size=4,
                  slots=SlotSpec(9, padding="some", placement="extremes"), table=TableSpec("plain", 4, 64),
                  cache_storage="uint8")
ROPE = RopeCase(seed=13, tokens=3, heads=3, kv_heads=1, head_size=8, dtype="bfloat16", is_neox=True,
                table=TableSpec("plain", 8, 64))


def threshold(device: torch.device, bytes_needed_per_element: int) -> int:
    if device.type != "cuda":
        return CPU_THRESHOLD
    free, _ = torch.cuda.mem_get_info(device)
    if free < bytes_needed_per_element * GPU_THRESHOLD * 1.2:
        pytest.skip(f"needs {bytes_needed_per_element * GPU_THRESHOLD / 2 ** 30:.1f} GiB of free GPU memory")
    return GPU_THRESHOLD


def _require(impl, operation, case):
    """``case`` inside what ``impl`` declares for ``operation`` (skip when it lacks the operation, or
    no case of this shape is inside its declared limits)."""
    if not impl.provides(operation):
        pytest.skip(f"{impl.name} does not provide {operation}")
    rotates = operation not in ("concat_and_cache_mla", "reshape_and_cache_flash")
    within = impl.caps(operation).project(case, rotates)
    if within is None:
        pytest.skip(f"{impl.name} declares no support for {impl.caps(operation).violations(case, rotates)}")
    return within


def _checked_small_run(impl, case, operation, device):
    built = build.build(case, device)
    expectation = oracle.expect(operation, built, impl)
    checks.call(impl, operation, built.args)
    comparisons.assert_matches(built.buffers, {n: b.flat for n, b in built.buffers.items()}, expectation)
    return built


def _huge_cache_like(small: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
    """A cache with the blocks of ``small`` as its last blocks, past ``limit`` elements; other blocks random."""
    block_elements = math.prod(small.shape[1:])
    extra_blocks = limit // block_elements + 1
    huge = torch.empty((extra_blocks + small.size(0), *small.shape[1:]), dtype=small.dtype, device=small.device)
    huge.view(torch.uint8).view(-1)[:] = torch.randint(0, 256, (huge.numel() * huge.element_size(),),
                                                       dtype=torch.uint8, device=small.device)
    return huge, extra_blocks


@pytest.mark.parametrize("case, operation, caches", [
    (MLA, "concat_and_cache_mla_rope_fused", ("kv_cache",)),
    (dataclasses.replace(MLA, kv_cache_dtype="auto", cache_storage="source"), "concat_and_cache_mla", ("kv_cache",)),
    (FLASH, "rope_and_reshape_and_cache_flash", ("key_cache", "value_cache")),
    (dataclasses.replace(FLASH, kv_cache_dtype="auto", cache_storage="source"), "reshape_and_cache_flash",
     ("key_cache", "value_cache")),
], ids=["mla-fused-fp8", "mla-auto", "flash-fused-fp8", "flash-auto"])
def test_cache_entries_past_the_threshold(mla_fuse_impl, mla_fuse_device, case, operation, caches):
    impl, device = mla_fuse_impl, mla_fuse_device
    case = _require(impl, operation, case)
    limit = threshold(device, 2 * len(caches) * (1 if case.kv_cache_dtype != "auto" else 2))
    small = _checked_small_run(impl, case, operation, device)
    large = build.build(case, device)
    pristine, shifts = {}, set()
    for name in caches:
        huge, extra_blocks = _huge_cache_like(large.args[name], limit)
        shifts.add(extra_blocks)
        huge[extra_blocks:] = large.args[name]
        pristine[name] = huge[:extra_blocks].clone()
        large.args[name] = huge
    assert len(shifts) == 1, "key and value caches need the same block count for one slot shift"
    slots = large.args["slot_mapping"]
    shift = extra_blocks * case.block_size
    large.args["slot_mapping"] = torch.where(slots >= 0, slots + shift, slots)
    checks.call(impl, operation, large.args)
    for name in caches:
        huge = large.args[name]
        assert torch.equal(memory.bits(huge[extra_blocks:]), memory.bits(small.args[name])), \
            f"{name}: entries past {limit} elements differ from the same entries written at small addresses"
        assert torch.equal(memory.bits(huge[:extra_blocks]), memory.bits(pristine[name])), \
            f"{name}: a write landed outside the written entries (wrapped address?)"


def test_query_rows_a_huge_stride_apart(mla_fuse_impl, mla_fuse_device):
    impl, device = mla_fuse_impl, mla_fuse_device
    case = _require(impl, "rotary_embedding", ROPE)
    limit = threshold(device, 2 * 2)
    small = _checked_small_run(impl, case, "rotary_embedding", device)
    large = build.build(case, device)
    query = large.args["query"]
    row = query[0].numel()
    token_stride = limit // (case.tokens - 1) + 1
    pool = torch.empty(token_stride * (case.tokens - 1) + row, dtype=query.dtype, device=device)
    pool.view(torch.int16).fill_(FILL)  # a NaN pattern: a wrong read shows in the result
    huge_query = torch.as_strided(pool, query.shape, (token_stride, *query.stride()[1:]), 0)
    huge_query.copy_(query)
    large.args["query"] = huge_query
    checks.call(impl, "rotary_embedding", large.args)
    assert torch.equal(memory.bits(huge_query), memory.bits(small.args["query"])), \
        f"query rows {token_stride} elements apart rotated differently from packed rows"
    for t in range(case.tokens - 1):  # the memory between the rows
        between = pool.view(torch.int16)[t * token_stride + row: (t + 1) * token_stride]
        assert bool((between == FILL).all()), f"a write landed between query rows {t} and {t + 1}"
