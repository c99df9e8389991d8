"""The engine cache layouts of the compile-pass properties are the layouts they claim to be."""

from __future__ import annotations

import pytest
import torch

from mla_fuse_conformance.cases.engine_caches import (
    ENGINE_LAYOUTS, CacheLayout, MhaCacheSpec, MlaCacheSpec, build_caches, pools_bitwise_equal,
)

SPECS = {"a": MlaCacheSpec(24), "b": MhaCacheSpec(2, 8), "c": MlaCacheSpec(24)}


def _storage(tensor):
    return tensor.untyped_storage().data_ptr()


@pytest.mark.parametrize("name", sorted(ENGINE_LAYOUTS))
def test_views_have_their_shapes_and_every_byte_starts_as_the_sentinel(name):
    caches = build_caches(SPECS, ENGINE_LAYOUTS[name], blocks=3, block_size=4, dtype=torch.bfloat16)
    assert caches.layers["a"].kv_cache.shape == (3, 4, 24)
    assert caches.layers["b"].key_cache.shape == caches.layers["b"].value_cache.shape == (3, 4, 2, 8)
    assert all((pool.view(torch.uint8) == 0x5A).all() for pool in caches.pools)
    assert caches.cache_bytes >= sum(t.numel() * 2 for t in (caches.layers["a"].kv_cache, caches.layers["c"].kv_cache,
                                                            caches.layers["b"].key_cache,
                                                            caches.layers["b"].value_cache))


def test_pools_alias_as_engines_alias_them():
    flash = build_caches(SPECS, CacheLayout("separate", "flash"), blocks=3, block_size=4, dtype=torch.bfloat16)
    b = flash.layers["b"]
    assert _storage(b.key_cache) == _storage(b.value_cache)            # kv_cache.unbind(0)
    assert b.value_cache.storage_offset() == 3 * 4 * 2 * 8             # V after all of K
    chunked = build_caches(SPECS, CacheLayout("chunked", "flash"), blocks=3, block_size=4, dtype=torch.bfloat16)
    assert len({_storage(t) for e in chunked.layers.values() for t in (e.kv_cache, e.key_cache) if t is not None}) == 1
    inter = build_caches(SPECS, CacheLayout("interleaved", "flashinfer"), blocks=3, block_size=4, dtype=torch.bfloat16)
    a, c = inter.layers["a"].kv_cache, inter.layers["c"].kv_cache
    widest = 2 * 4 * 2 * 8
    assert a.stride(0) == c.stride(0) == 3 * widest and c.storage_offset() - a.storage_offset() == 2 * widest
    hnd = build_caches(SPECS, CacheLayout("chunked", "flash", hnd=True), blocks=3, block_size=4, dtype=torch.bfloat16)
    assert hnd.layers["b"].key_cache.stride()[1:] == (8, 4 * 8, 1)    # [Hkv, B, D] in memory
    halves = build_caches(SPECS, CacheLayout("chunked", "halves"), blocks=3, block_size=4, dtype=torch.bfloat16)
    k, v = halves.layers["b"].key_cache, halves.layers["b"].value_cache
    assert k.stride() == v.stride() == (4 * 2 * 16, 2 * 16, 16, 1)       # each head's row: K then V
    assert v.storage_offset() - k.storage_offset() == 8 and _storage(k) == _storage(v)
    both = build_caches(SPECS, CacheLayout("separate", "halves", hnd=True), blocks=3, block_size=4, dtype=torch.bfloat16)
    assert both.layers["b"].key_cache.stride() == (2 * 4 * 16, 16, 4 * 16, 1)  # [Hkv, B, 2D] in memory


def test_clone_rebuilds_each_view_in_the_copy_and_comparison_sees_every_byte():
    caches = build_caches(SPECS, CacheLayout("interleaved", "flashinfer"), blocks=3, block_size=4,
                          dtype=torch.bfloat16)
    copy = caches.clone()
    assert _storage(copy.layers["a"].kv_cache) == _storage(copy.pools[0]) != _storage(caches.pools[0])
    assert copy.layers["c"].kv_cache.stride() == caches.layers["c"].kv_cache.stride()
    assert not pools_bitwise_equal(copy, caches)
    copy.pools[0].view(torch.uint8)[-1] = 0  # padding past the MLA entries: outside every view
    assert "1 bytes differ" in pools_bitwise_equal(copy, caches)[0]
