"""Known answers for the reference's paged-cache writes and fused compositions (CONTRACT §2-§4)."""

import pytest
import torch

from mla_fuse_reference import fp8, ops, rope
from mla_fuse_reference.adapter import ReferenceImplementation

SENTINEL = -7.25


def test_mla_write_places_latent_then_rope_and_skips_padding():
    kv_c = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    k_pe = torch.tensor([[10.0], [30.0], [50.0], [70.0]])
    cache = torch.full((3, 2, 3), SENTINEL)  # NB=3, B=2, L+R=3
    # token 0 -> slot 3 (block 1, offset 1); token 1 padded; token 2 -> slot 0; token 3 past the mapping
    slots = torch.tensor([3, -1, 0])
    new = ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.tensor([1.0]))
    assert new[1, 1].tolist() == [1.0, 2.0, 10.0]
    assert new[0, 0].tolist() == [5.0, 6.0, 50.0]
    untouched = torch.ones(3, 2, dtype=torch.bool)
    untouched[1, 1] = untouched[0, 0] = False
    assert new[untouched].eq(SENTINEL).all()  # slot -1 did not become the last slot
    assert cache.eq(SENTINEL).all()  # functional: the argument is unchanged


@pytest.mark.parametrize("kv_cache_dtype, fmt, storage", [
    ("fp8", "e4m3", torch.uint8), ("fp8_e4m3", "e4m3", torch.float8_e4m3fn), ("fp8_e5m2", "e5m2", torch.uint8),
    ("fp8_e5m2", "e5m2", torch.float8_e5m2)])
def test_mla_write_fp8_codes(kv_cache_dtype, fmt, storage):
    kv_c, k_pe, scale = torch.randn(3, 4).to(torch.bfloat16) * 100, torch.randn(3, 2).to(torch.bfloat16), torch.tensor([0.3])
    cache = torch.zeros(2, 2, 6, dtype=storage)
    new = ops.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([2, 0, 1]), kv_cache_dtype, scale)
    assert new.dtype == storage
    expected = fp8.quantize(torch.cat([kv_c, k_pe], -1), scale, fmt)
    assert torch.equal(new.view(torch.uint8).reshape(4, 6)[[2, 0, 1]], expected)


def test_flash_write_per_head_scales_and_strided_cache():
    key = torch.randn(2, 3, 4) * 10
    value = torch.randn(2, 3, 5) * 10
    k_scale, v_scale = torch.tensor([0.5, 1.0, 2.0]), torch.tensor([3.0])
    # HND storage [NB, Hkv, B, D] seen as [NB, B, Hkv, D]
    key_cache = torch.zeros(2, 3, 2, 4, dtype=torch.uint8).permute(0, 2, 1, 3)
    value_cache = torch.zeros(2, 2, 3, 5, dtype=torch.uint8)
    new_k, new_v = ops.reshape_and_cache_flash(key, value, key_cache, value_cache, torch.tensor([3, -1]), "fp8",
                                               k_scale, v_scale)
    assert torch.equal(new_k[1, 1], fp8.quantize(key[0], k_scale[:, None], "e4m3"))
    assert torch.equal(new_v[1, 1], fp8.quantize(value[0], v_scale, "e4m3"))
    assert new_k.sum() == fp8.quantize(key[0], k_scale[:, None], "e4m3").sum()  # nothing else written


def test_fused_mla_is_rope_then_cache_write():
    torch.manual_seed(0)
    table = rope.plain_cos_sin_cache(8, 64, dtype=torch.bfloat16)
    positions = torch.tensor([3, 63, 0, 17])
    q_pe, k_pe, kv_c = (torch.randn(4, 2, 8).to(torch.bfloat16), torch.randn(4, 8).to(torch.bfloat16),
                        torch.randn(4, 16).to(torch.bfloat16))
    cache = torch.zeros(4, 4, 24, dtype=torch.uint8)
    slots, scale = torch.tensor([5, -1, 9]), torch.tensor([0.05])
    new_q, new_k, new_cache = ops.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, table, False, slots,
                                                                  cache, "fp8", scale)
    q2, k2 = ops.rotary_embedding(positions, q_pe, k_pe, 8, table, False)
    assert torch.equal(new_q, q2) and torch.equal(new_k, k2)  # padded rows rotated too
    assert torch.equal(new_cache, ops.concat_and_cache_mla(kv_c, k2, cache, slots, "fp8", scale))


def test_adapter_writes_in_place_into_parent_tensors():
    torch.manual_seed(1)
    table = rope.plain_cos_sin_cache(4, 8)
    positions = torch.tensor([1, 5])
    q = torch.randn(2, 3, 6)  # nope 2 + rope 4
    projection = torch.randn(2, 8 + 4)  # [kv_c (8) | k_pe (4)]
    pool = torch.full((5, 2, 12), SENTINEL)
    kv_cache = pool[1:4]  # a view into a larger pool
    expected = ops.concat_and_cache_mla_rope_fused(positions, q[..., 2:], projection[:, 8:], projection[:, :8],
                                                   table, True, torch.tensor([0, 5]), kv_cache, "auto",
                                                   torch.tensor([1.0]))
    before_nope = q[..., :2].clone()
    ReferenceImplementation().concat_and_cache_mla_rope_fused(
        positions, q[..., 2:], projection[:, 8:], projection[:, :8], table, True, torch.tensor([0, 5]), kv_cache,
        "auto", torch.tensor([1.0]))
    assert torch.equal(q[..., 2:], expected[0]) and torch.equal(q[..., :2], before_nope)
    assert torch.equal(projection[:, 8:], expected[1])
    assert torch.equal(pool[1:4], expected[2])
    assert pool[0].eq(SENTINEL).all() and pool[4].eq(SENTINEL).all()
