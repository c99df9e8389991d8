"""Addresses past 2^31 elements (BUGS.md: int32 overflow in address arithmetic).

A kernel that computes ``block * block_stride`` or ``token * token_stride`` in int32
writes to the wrong place once the product passes 2^31. These tests run one small
case twice: once on ordinary tensors (checked against the reference by the oracle),
once with the cache's entries in its last blocks past the threshold (or q rows
``token_stride`` apart), and require the same bits in the same entries and no other
byte changed. The threshold is 2^31 elements on every device (about 2 GiB per fp8 cache,
4 GiB per bf16 cache or q pool): CPU kernels overflow int32 as GPU kernels do. A device
without that much free memory skips these tests and says how much they need. The memory
before the entries holds a fill pattern, checked in chunks, so a test needs little more
memory than its huge tensors.

They run in the ``ci``, ``gpu``, ``nightly`` and ``replay`` profiles and are skipped in ``dev``
(``mla-fuse verify``'s default off CI, meant to answer in a minute or two): filling and checking
up to 8.9 GB takes 6 to 40 s per test on a CPU (docs/REAL_SIZES.md).
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.judging import comparisons
from mla_fuse_conformance.running import checks
from mla_fuse_conformance.cases import memory
from mla_fuse_conformance.judging import oracle
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase, SlotSpec, TableSpec
from mla_fuse_conformance.settings import profiles

THRESHOLD = 2 ** 31 + 2 ** 16
FILL = 0x7FC1  # q pools: a NaN pattern, so a wrong read shows in the result
CACHE_FILL = 0xA5  # every byte of the cache blocks before the entries
CHUNK = 2 ** 26

MLA = MlaCase(seed=11, tokens=9, heads=2, latent=12, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="fp8_e4m3",
              num_blocks=3, block_size=4, slots=SlotSpec(9, padding="some", placement="extremes"),
              table=TableSpec("plain", 4, 64), cache_storage="uint8")
FLASH = FlashCase(seed=12, tokens=9, heads=4, kv_heads=2, head_size=8, value_head_size=8, dtype="bfloat16",
                  kv_cache_dtype="fp8_e4m3", num_blocks=3, block_size=4,
                  slots=SlotSpec(9, padding="some", placement="extremes"), table=TableSpec("plain", 4, 64),
                  cache_storage="uint8")
ROPE = RopeCase(seed=13, tokens=3, heads=3, kv_heads=1, head_size=8, dtype="bfloat16", is_neox=True,
                table=TableSpec("plain", 8, 64))


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # Linux: what can be allocated without swapping, page cache included
        with open("/proc/meminfo") as meminfo:
            return next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def threshold(device: torch.device, bytes_needed_per_element: int) -> int:
    """The element count past which the test writes; skips in the ``dev`` profile, and on a
    device without the memory the test needs."""
    if profiles.current() in profiles.LARGE_ADDRESSES_SKIPPED_IN:
        pytest.skip(f"large addresses: {profiles.LARGE_ADDRESSES_NOT_RUN}")
    needed = bytes_needed_per_element * THRESHOLD
    if free_bytes(device) < needed * 1.2:
        pytest.skip(f"needs {needed / 2 ** 30:.1f} GiB of free {device.type} memory")
    return THRESHOLD


def holds_only(tensor: torch.Tensor, byte: int) -> bool:
    """Every byte of ``tensor`` (contiguous) is ``byte``, checked a chunk at a time."""
    flat = tensor.view(torch.uint8).view(-1)
    return all(bool((flat[start: start + CHUNK] == byte).all()) for start in range(0, flat.numel(), CHUNK))


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
    """The control: the case at small addresses, against the reference (a failure here is not about
    addresses, and says so first)."""
    built = tensors.build(case, device)
    expectation = oracle.expect(operation, built, impl)
    checks.call(impl, operation, built.args)
    try:
        comparisons.assert_matches(built.buffers, {n: b.flat for n, b in built.buffers.items()}, expectation)
    except AssertionError as error:
        raise AssertionError(f"at small addresses, before any past 2^31 (the control): {error}") from None
    return built


def _huge_cache_like(small: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
    """A cache with the blocks of ``small`` as its last blocks, past ``limit`` elements; the blocks
    before them hold ``CACHE_FILL`` in every byte."""
    block_elements = math.prod(small.shape[1:])
    extra_blocks = limit // block_elements + 1
    huge = torch.empty((extra_blocks + small.size(0), *small.shape[1:]), dtype=small.dtype, device=small.device)
    huge[:extra_blocks].view(torch.uint8).fill_(CACHE_FILL)
    return huge, extra_blocks


@pytest.mark.parametrize("case, operation, caches", [
    (MLA, "concat_and_cache_mla_rope_fused", ("kv_cache",)),
    (dataclasses.replace(MLA, kv_cache_dtype="auto", cache_storage="source"), "concat_and_cache_mla", ("kv_cache",)),
    (FLASH, "rope_and_reshape_and_cache_flash", ("key_cache", "value_cache")),
    (dataclasses.replace(FLASH, kv_cache_dtype="auto", cache_storage="source"), "reshape_and_cache_flash",
     ("key_cache", "value_cache")),
], ids=["mla-fused-fp8", "mla-auto", "flash-fused-fp8", "flash-auto"])
def test_cache_entries_past_the_threshold(mla_fuse_impl, mla_fuse_device, case, operation, caches):
    """Cache entries 2^31 elements or more past the cache's start, written as at small addresses.

    The case runs first at small addresses against the reference (the control), then with its caches'
    written blocks moved past 2^31 + 2^16 elements (the slots shifted with them): the same bits in the
    same entries, and every byte before them unchanged."""
    impl, device = mla_fuse_impl, mla_fuse_device
    case = _require(impl, operation, case)
    limit = threshold(device, len(caches) * (1 if case.kv_cache_dtype != "auto" else 2))
    small = _checked_small_run(impl, case, operation, device)
    large = tensors.build(case, device)
    shifts = set()
    for name in caches:
        huge, extra_blocks = _huge_cache_like(large.args[name], limit)
        shifts.add(extra_blocks)
        huge[extra_blocks:] = large.args[name]
        large.args[name] = huge
    assert len(shifts) == 1, "key and value caches need the same block count for one slot shift"
    slots = large.args["slot_mapping"]
    shift = extra_blocks * case.block_size
    reserved = oracle.reserved_slot(large)  # a declared padding slot stays where it is, its contents not judged
    moved = slots >= 0 if reserved is None else (slots >= 0) & (slots != reserved)
    large.args["slot_mapping"] = torch.where(moved, slots + shift, slots)
    checks.call(impl, operation, large.args)
    for name in caches:
        huge = large.args[name]
        if reserved is not None:
            block, entry = divmod(reserved, case.block_size)
            huge[block, entry].view(torch.uint8).fill_(CACHE_FILL)
            huge[extra_blocks + block, entry] = small.args[name][block, entry]
        assert torch.equal(memory.bits(huge[extra_blocks:]), memory.bits(small.args[name])), \
            f"{name}: entries past {limit} elements differ from the same entries written at small addresses"
        assert holds_only(huge[:extra_blocks], CACHE_FILL), \
            f"{name}: a write landed outside the written entries (wrapped address?)"


def test_query_rows_a_huge_stride_apart(mla_fuse_impl, mla_fuse_device):
    """Query rows a token stride apart that puts the last row 2^31 elements or more past the first,
    rotated as packed rows.

    The case runs first with packed rows against the reference (the control), then with its query
    rows that far apart: the same bits, and nothing written between the rows."""
    impl, device = mla_fuse_impl, mla_fuse_device
    case = _require(impl, "rotary_embedding", ROPE)
    limit = threshold(device, 2)
    small = _checked_small_run(impl, case, "rotary_embedding", device)
    large = tensors.build(case, device)
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
