"""Paged caches laid out the way serving engines lay them out.

An engine owns one KV pool and hands each attention layer *views* of it; K and V are
usually two views of one tensor. ``build_caches`` reproduces those layouts:

============  ==================================================================================
``pool``      where each layer's cache lives
============  ==================================================================================
separate      one allocation per layer (per K and per V with ``kv="split"``)
chunked       one pool; layer ``i`` is a contiguous chunk of it (``pool.view(layers, ...)[i]``)
interleaved   one pool ``[NB, layers, S]``: block ``b`` of every layer side by side
              (``pool.view(NB, layers, S)[:, i, :S_i].view(NB, B, ...)``); ``S`` = the widest layer
============  ==================================================================================

MHA layers also have a K/V form and a head order:

* ``kv="flash"``: ``key_cache, value_cache = kv_cache.unbind(0)`` of one ``[2, NB, B, Hkv, D]``
  tensor (vLLM's FlashAttention backend);
* ``kv="flashinfer"``: ``kv_cache.unbind(1)`` of ``[NB, 2, B, Hkv, D]`` (K and V of a block side by
  side; the only MHA form an interleaved pool holds, since it is block-major);
* ``kv="halves"``: ``kv_cache.split(D, dim=-1)`` of one ``[NB, B, Hkv, 2D]`` tensor (each head's row
  holds its K then its V: vLLM 0.33's pool, so a key_cache head stride is ``2D``);
* ``kv="split"``: two allocations (only with ``pool="separate"``);
* ``hnd=True``: memory order ``[.., Hkv, B, D]`` inside a block, seen as ``[.., B, Hkv, D]``
  through a permutation (vLLM's HND layout).

MLA layers hold ``[NB, B, L + R]``. Every byte of every pool starts as ``SENTINEL`` (never
zeros), so a write outside a view, into the wrong layer, or into a copy shows when the pools
are compared (``pools_bitwise_equal``).

What one step allocates is measured by ``running.devices.allocated_bytes`` (per device: the CPU
memory profiler, or CUDA's allocator statistics): CONTRACT §6 requires a compiled step to allocate
nothing that grows with the cache.
"""

from __future__ import annotations

import dataclasses

import torch

from mla_fuse.layers import LayerKVCache
from mla_fuse_conformance.declarations.layout_types import KV_FORMS as ALL_KV_FORMS

SENTINEL = 0x5A
POOLS = ("separate", "chunked", "interleaved")
# the K/V forms (declarations.layout_types.KV_FORMS, the names the property cases use), all built here
KV_FORMS = tuple(ALL_KV_FORMS)


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    pool: str = "separate"
    kv: str = "flash"      # MHA layers only
    hnd: bool = False      # MHA layers only

    def __post_init__(self) -> None:
        if self.pool not in POOLS or self.kv not in KV_FORMS:
            raise ValueError(f"CacheLayout: pool must be one of {POOLS}, kv one of {KV_FORMS}; got {self}")
        if self.kv == "split" and self.pool != "separate":
            raise ValueError("CacheLayout: kv='split' (two allocations) only with pool='separate'")
        if self.kv == "flash" and self.pool == "interleaved":
            raise ValueError("CacheLayout: an interleaved pool is block-major; use kv='flashinfer'")

    def describe(self) -> str:
        return f"{self.pool} pool, kv={self.kv}{', HND' if self.hnd else ''}"


ENGINE_LAYOUTS = {  # the layouts the benchmark and the acceptance test name
    "separate": CacheLayout("separate", "split"),
    "kv_unbind": CacheLayout("separate", "flash"),
    "pool_chunked": CacheLayout("chunked", "flash"),
    "pool_interleaved": CacheLayout("interleaved", "flashinfer"),
    "pool_chunked_hnd": CacheLayout("chunked", "flash", hnd=True),
    "pool_chunked_halves": CacheLayout("chunked", "halves"),
}


@dataclasses.dataclass(frozen=True)
class MlaCacheSpec:
    width: int                 # L + R

    def block_numel(self, block_size: int) -> int:
        return block_size * self.width


@dataclasses.dataclass(frozen=True)
class MhaCacheSpec:
    kv_heads: int
    head_size: int

    def half_numel(self, block_size: int) -> int:
        return block_size * self.kv_heads * self.head_size

    def block_numel(self, block_size: int) -> int:
        return 2 * self.half_numel(block_size)


@dataclasses.dataclass
class EngineCaches:
    """The forward context's ``layers`` (views) and the pools that own their memory."""

    layers: dict[str, LayerKVCache]
    pools: list[torch.Tensor]
    layout: CacheLayout

    @property
    def cache_bytes(self) -> int:
        return sum(pool.numel() * pool.element_size() for pool in self.pools)

    def clone(self) -> "EngineCaches":
        """Copies of the pools with every view rebuilt at the same place in the copy."""
        pools = [pool.clone() for pool in self.pools]
        layers = {name: dataclasses.replace(entry, **{
            field: _rebase(getattr(entry, field), self.pools, pools)
            for field in ("kv_cache", "key_cache", "value_cache") if getattr(entry, field) is not None})
            for name, entry in self.layers.items()}
        return EngineCaches(layers, pools, self.layout)


def _rebase(view: torch.Tensor, old_pools: list[torch.Tensor], new_pools: list[torch.Tensor]) -> torch.Tensor:
    for old, new in zip(old_pools, new_pools):
        if view.untyped_storage().data_ptr() == old.untyped_storage().data_ptr():
            offset = view.storage_offset() - old.storage_offset()
            return new.as_strided(view.size(), view.stride(), new.storage_offset() + offset)
    raise AssertionError("cache view outside every pool")


def _pool(numel: int, dtype: torch.dtype, device) -> torch.Tensor:
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return torch.full((nbytes,), SENTINEL, dtype=torch.uint8, device=device).view(dtype)


def _mha_views(region: torch.Tensor, spec: MhaCacheSpec, layout: CacheLayout, blocks: int,
               block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views of one layer's region (``[numel]`` for flash, ``[NB, 2 * half]`` otherwise)."""
    heads, size = spec.kv_heads, spec.head_size
    inner = (heads, block_size, size) if layout.hnd else (block_size, heads, size)
    if layout.kv == "halves":
        rows = region.view(blocks, *inner[:-1], 2 * size)
        rows = rows.transpose(1, 2) if layout.hnd else rows
        return rows[..., :size], rows[..., size:]
    if layout.kv == "flash":
        kv = region.view(2, blocks, *inner)
        kv_dim = 0
    else:
        kv = region.view(blocks, 2, *inner)
        kv_dim = 1
    if layout.hnd:
        kv = kv.transpose(-3, -2)
    return kv.unbind(kv_dim)


def _scales(index: int, device) -> dict[str, torch.Tensor]:
    return {"k_scale": torch.tensor([0.05 * (index + 1)], dtype=torch.float32, device=device),
            "v_scale": torch.tensor([0.03 * (index + 1)], dtype=torch.float32, device=device)}


def _layer_entry(region: torch.Tensor, spec, layout: CacheLayout, blocks: int, block_size: int,
                 kv_cache_dtype: str, index: int) -> LayerKVCache:
    scales = _scales(index, region.device)
    if isinstance(spec, MlaCacheSpec):
        return LayerKVCache(kv_cache_dtype, kv_cache=region.view(blocks, block_size, spec.width), **scales)
    key_cache, value_cache = _mha_views(region, spec, layout, blocks, block_size)
    return LayerKVCache(kv_cache_dtype, key_cache=key_cache, value_cache=value_cache, **scales)


def _split_entry(spec: MhaCacheSpec, layout: CacheLayout, blocks: int, block_size: int, dtype, device,
                 kv_cache_dtype: str, index: int) -> tuple[LayerKVCache, list[torch.Tensor]]:
    """K and V in two allocations of their own."""
    pools = [_pool(blocks * spec.half_numel(block_size), dtype, device) for _ in range(2)]
    heads, size = spec.kv_heads, spec.head_size
    inner = (heads, block_size, size) if layout.hnd else (block_size, heads, size)
    key_cache, value_cache = (pool.view(blocks, *inner) for pool in pools)
    if layout.hnd:
        key_cache, value_cache = key_cache.transpose(1, 2), value_cache.transpose(1, 2)
    entry = LayerKVCache(kv_cache_dtype, key_cache=key_cache, value_cache=value_cache, **_scales(index, device))
    return entry, pools


def build_caches(specs: dict[str, MlaCacheSpec | MhaCacheSpec], layout: CacheLayout, *, blocks: int,
                 block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto",
                 device="cpu") -> EngineCaches:
    """Sentinel-filled caches of ``dtype`` storage for each named layer, laid out as ``layout`` says;
    a distinct ``k_scale``/``v_scale`` per layer (``0.05 (i+1)``, ``0.03 (i+1)``)."""
    numels = [blocks * spec.block_numel(block_size) for spec in specs.values()]
    layers, pools = {}, []
    if layout.pool == "interleaved":
        widest = max(spec.block_numel(block_size) for spec in specs.values())
        pool = _pool(blocks * len(specs) * widest, dtype, device)
        pools.append(pool)
        grid = pool.view(blocks, len(specs), widest)
        for i, (name, spec) in enumerate(specs.items()):
            region = grid[:, i, :spec.block_numel(block_size)]
            layers[name] = _layer_entry(region, spec, layout, blocks, block_size, kv_cache_dtype, i)
        return EngineCaches(layers, pools, layout)
    if layout.pool == "chunked":
        pools.append(_pool(sum(numels), dtype, device))
    starts = [sum(numels[:i]) for i in range(len(numels))]
    for i, (name, spec) in enumerate(specs.items()):
        if layout.kv == "split" and isinstance(spec, MhaCacheSpec):
            layers[name], own = _split_entry(spec, layout, blocks, block_size, dtype, device, kv_cache_dtype, i)
            pools += own
            continue
        if layout.pool == "chunked":
            region = pools[0][starts[i]:starts[i] + numels[i]]
        else:
            region = _pool(numels[i], dtype, device)
            pools.append(region)
        if isinstance(spec, MlaCacheSpec) or layout.kv == "flash":
            layers[name] = _layer_entry(region, spec, layout, blocks, block_size, kv_cache_dtype, i)
        else:
            layers[name] = _layer_entry(region.view(blocks, -1), spec, layout, blocks, block_size,
                                        kv_cache_dtype, i)
    return EngineCaches(layers, pools, layout)


def pools_bitwise_equal(actual: EngineCaches, expected: EngineCaches) -> list[str]:
    """Differences between the pools' bytes (every byte, inside the views or not), as messages."""
    problems = []
    for i, (a, e) in enumerate(zip(actual.pools, expected.pools)):
        a_bytes, e_bytes = a.view(torch.uint8), e.view(torch.uint8)
        if not torch.equal(a_bytes, e_bytes):
            where = (a_bytes != e_bytes).nonzero().flatten()
            problems.append(f"pool {i} ({actual.layout.describe()}): {where.numel()} bytes differ, "
                            f"first at byte {int(where[0])}")
    return problems
