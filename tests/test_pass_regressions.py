"""The compile path as a serving engine runs it, as regression tests on real Inductor.

A 3-layer hybrid model (DeepSeek-like MLA layers with the native and the DeepSeek-scaling rope,
a Llama-like MHA layer with the native rope) built from the public layers only, compiled the
way engines compile: ``backend="inductor"``, the token count marked dynamic. Each bug of the
issue has its check here:

1. native ropes did not fuse with a dynamic token count (counts read 0);
2. the MLA pattern bound k's rope chain as q's on Inductor's graph (a crash, or for MHA a
   double-rotated k): every q, k and cache byte is compared with eager;
3. compiled steps copied the KV cache when caches alias (K/V views of one tensor, layers views
   of one pool): with every engine layout, at O1, O2 and O3, one step must allocate well
   under 5% of the cache's bytes, and the bytes must not grow with the cache;
5. match counts read 0 when Inductor's FX graph cache served the graph.

The caches do not enter the compiled graph (``mla_fuse.layers.unified_ops``), so one compile
per level serves every layout. The model, caches and steps are built on the kernels' device and
a step's allocations counted there (``mla_fuse_conformance.running.devices``: CUDA when mla_fuse's
kernels run on the GPU in this process, else the CPU); otherwise only the public API is used.
"""

from __future__ import annotations

import uuid

import pytest
import torch

import mla_fuse.compile as mc
from mla_fuse.layers import (
    DeepseekScalingRotaryEmbedding, LayerKVCache, MHAAttention, MLAAttention, RotaryEmbedding, set_forward_context,
)
from mla_fuse_conformance.running.devices import allocated_bytes, kernels_device

LAYERS = ("model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn")
HIDDEN, BLOCKS, BLOCK_SIZE, SENTINEL = 32, 1024, 16, 0x5A
MLA_WIDTH, KV_HEADS, HEAD = 16 + 8, 2, 16
LAYOUTS = ("separate", "kv_unbind", "pool_chunked", "pool_interleaved", "pool_chunked_hnd")
ALLOCATION_LIMIT = 0.05  # of the cache's bytes: a step that copies a cache allocates >= 100%


class Model(torch.nn.Module):
    def __init__(self, use_custom_op: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        mla_rope = RotaryEmbedding(8, 8, 64, 10000.0, False, use_custom_op=use_custom_op)
        yarn_rope = DeepseekScalingRotaryEmbedding(8, 8, 16, 10000.0, False, 4.0, mscale=0.707, mscale_all_dim=0.707,
                                                   use_custom_op=use_custom_op)
        mha_rope = RotaryEmbedding(HEAD, HEAD, 64, 10000.0, True, use_custom_op=use_custom_op)
        self.layers = torch.nn.ModuleList([
            MLAAttention(HIDDEN, 2, 8, 8, 8, 16, mla_rope, LAYERS[0]),
            MHAAttention(HIDDEN, 4, KV_HEADS, HEAD, mha_rope, LAYERS[1]),
            MLAAttention(HIDDEN, 2, 8, 8, 8, 16, yarn_rope, LAYERS[2]),
        ]).to(device=kernels_device(), dtype=torch.bfloat16)

    def forward(self, positions, hidden):
        rotated = []
        for layer in self.layers:
            out, q, k = layer.forward_with_rope_outputs(positions, hidden)
            rotated += [q, k]
            hidden = (hidden.float() + out.float()).to(hidden.dtype)  # fp32 residual: no addmm rewrite
        return hidden, rotated


def _pool(numel: int) -> torch.Tensor:
    return torch.full((numel * 2,), SENTINEL, dtype=torch.uint8, device=kernels_device()).view(torch.bfloat16)


def engine_caches(layout: str) -> tuple[dict[str, LayerKVCache], list[torch.Tensor]]:
    """The layers' caches as views of pools, laid out as ``layout`` (see the module docstring)."""
    mla_numel, half = BLOCKS * BLOCK_SIZE * MLA_WIDTH, BLOCKS * BLOCK_SIZE * KV_HEADS * HEAD
    if layout == "pool_interleaved":  # block b of every layer side by side: [NB, layers, S]
        widest = 2 * BLOCK_SIZE * KV_HEADS * HEAD
        pools = [_pool(BLOCKS * 3 * widest)]
        grid = pools[0].view(BLOCKS, 3, widest)
        mla = [grid[:, i, :BLOCK_SIZE * MLA_WIDTH].view(BLOCKS, BLOCK_SIZE, MLA_WIDTH) for i in (0, 2)]
        key_cache, value_cache = grid[:, 1].view(BLOCKS, 2, BLOCK_SIZE, KV_HEADS, HEAD).unbind(1)
    elif layout == "separate":
        pools = [_pool(mla_numel), _pool(half), _pool(half), _pool(mla_numel)]
        mla = [pools[0].view(BLOCKS, BLOCK_SIZE, MLA_WIDTH), pools[3].view(BLOCKS, BLOCK_SIZE, MLA_WIDTH)]
        key_cache, value_cache = (p.view(BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD) for p in pools[1:3])
    else:
        chunked = layout != "kv_unbind"
        pools = [_pool(2 * mla_numel + 2 * half)] if chunked else [_pool(mla_numel), _pool(2 * half), _pool(mla_numel)]
        chunks = (pools[0].split([mla_numel, 2 * half, mla_numel]) if chunked else pools)
        mla = [chunks[i].view(BLOCKS, BLOCK_SIZE, MLA_WIDTH) for i in (0, 2)]
        if layout == "pool_chunked_hnd":  # [2, NB, Hkv, B, D] in memory, seen as [2, NB, B, Hkv, D]
            kv = chunks[1].view(2, BLOCKS, KV_HEADS, BLOCK_SIZE, HEAD).transpose(2, 3)
        else:
            kv = chunks[1].view(2, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD)
        key_cache, value_cache = kv.unbind(0)
    layers = {
        LAYERS[0]: LayerKVCache("auto", kv_cache=mla[0]),
        LAYERS[1]: LayerKVCache("auto", key_cache=key_cache, value_cache=value_cache),
        LAYERS[2]: LayerKVCache("auto", kv_cache=mla[1]),
    }
    return layers, pools


def step(tokens: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 64, (tokens,), generator=generator)
    hidden = torch.randn(tokens, HIDDEN, generator=generator).to(torch.bfloat16)
    slots = {name: torch.randperm(BLOCKS * BLOCK_SIZE, generator=generator)[:tokens] for name in LAYERS}
    slots[LAYERS[1]][-1] = -1
    device = kernels_device()
    return positions.to(device), hidden.to(device), {name: s.to(device) for name, s in slots.items()}


def run(model, caches, positions, hidden, slots, *, dynamic: bool):
    if dynamic:
        positions, hidden = positions.clone(), hidden.clone()
        torch._dynamo.mark_dynamic(positions, 0)
        torch._dynamo.mark_dynamic(hidden, 0)
    with torch.no_grad(), set_forward_context(caches, slots):
        out, rotated = model(positions, hidden)
    return [out.clone()] + [t.clone() for t in rotated]


def assert_bitwise(actual, expected, what):
    a, e = actual.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    assert torch.equal(a, e), f"{what}: {int((a != e).sum())} bytes differ"


@pytest.fixture(scope="module")
def eager_results():
    """Eager (custom-op rope: the unfused kernels) on every layout, for two token counts."""
    reference = Model(use_custom_op=True)
    results = {}
    for layout in LAYOUTS:
        for tokens in (5, 3):
            caches, pools = engine_caches(layout)
            outputs = run(reference, caches, *step(tokens, tokens), dynamic=False)
            results[layout, tokens] = outputs, [p.clone() for p in pools]
    return results


def _check_step(compiled, layout, tokens, eager_results):
    caches, pools = engine_caches(layout)
    outputs = run(compiled, caches, *step(tokens, tokens), dynamic=True)
    expected_outputs, expected_pools = eager_results[layout, tokens]
    for i, (a, e) in enumerate(zip(outputs, expected_outputs)):
        assert_bitwise(a, e, f"{layout}: {'output' if i == 0 else f'layer {(i - 1) // 2} q/k'}")
    for i, (a, e) in enumerate(zip(pools, expected_pools)):
        assert_bitwise(a, e, f"{layout}: pool {i}")
    return caches, pools


@pytest.mark.parametrize("level", [1, 2, 3])
def test_inductor_dynamic_tokens_fuse_copy_free_and_match_eager(level, eager_results):
    torch._dynamo.reset()
    with torch.compiler.config.patch(cache_key_tag=f"mla_fuse-regression-{uuid.uuid4().hex}"):
        compiled = mc.compile(Model(use_custom_op=False), backend="inductor", level=level)
        for layout in LAYOUTS:
            for tokens in (5, 3):  # one graph for both token counts
                _check_step(compiled, layout, tokens, eager_results)
        counts = mc.match_counts(compiled)
        fused = 0 if level == 1 else 1
        assert counts.get("mla_rope_kvcache_fusion", 0) == 2 * fused, counts       # issue item 1 (and 2)
        assert counts.get("rope_kvcache_fusion", 0) == fused, counts

        for layout in LAYOUTS:                                                # issue item 3
            caches, pools = engine_caches(layout)
            args = step(5, 5)
            cache_bytes = sum(p.numel() * p.element_size() for p in pools)
            used = allocated_bytes(lambda: run(compiled, caches, *args, dynamic=True))
            assert used < ALLOCATION_LIMIT * cache_bytes, \
                f"O{level} {layout}: one step allocated {used} bytes, {100 * used / cache_bytes:.1f}% of the cache"
        assert len(mc.graph_records(compiled)) == 1, "recompiled for another token count or layout"

        if level == 2:                                                        # issue item 5
            torch._dynamo.reset()
            again = mc.compile(Model(use_custom_op=False), backend="inductor", level=level)
            _check_step(again, "pool_interleaved", 5, eager_results)
            assert mc.match_counts(again) == counts, "counts after an FX graph cache hit"
            assert mc.cache_hits(again) == 1, "the second compile should have come from the FX graph cache"


# ------------------------------------------------------------------ the single-layer forms of items 1 and 2


def _single_layer(kind: str, use_custom_op: bool):
    torch.manual_seed(0)
    if kind == "mla":
        rope = RotaryEmbedding(8, 8, 64, 10000.0, False, use_custom_op=use_custom_op)
        return MLAAttention(HIDDEN, 2, 8, 8, 8, 16, rope, LAYERS[0]).to(device=kernels_device(), dtype=torch.bfloat16)
    rope = RotaryEmbedding(HEAD, HEAD, 64, 10000.0, True, use_custom_op=use_custom_op)
    return MHAAttention(HIDDEN, 4, KV_HEADS, HEAD, rope, LAYERS[1]).to(device=kernels_device(), dtype=torch.bfloat16)


def _single_layer_caches(kind: str):
    layers, pools = engine_caches("pool_chunked")
    return {name: entry for name, entry in layers.items() if name == LAYERS[0 if kind == "mla" else 1]}, pools


@pytest.mark.parametrize("backend, kind, dynamic", [
    ("light", "mla", True), ("light", "mha", True),   # item 1: native rope, dynamic tokens: counts read 0
    ("inductor", "mla", False),                        # item 2: static shapes too: q_pe bound to k's chain
])
def test_native_rope_fuses_with_the_right_q_and_k(backend, kind, dynamic):
    positions, hidden, slots = step(5, 7)
    expected_caches, expected_pools = _single_layer_caches(kind)
    with torch.no_grad(), set_forward_context(expected_caches, slots):
        expected = _single_layer(kind, use_custom_op=True).forward_with_rope_outputs(positions, hidden)
    caches, pools = _single_layer_caches(kind)
    torch._dynamo.reset()
    compiled = mc.compile(_single_layer(kind, use_custom_op=False).forward_with_rope_outputs, backend=backend)
    if dynamic:
        positions, hidden = positions.clone(), hidden.clone()
        torch._dynamo.mark_dynamic(positions, 0)
        torch._dynamo.mark_dynamic(hidden, 0)
    with torch.no_grad(), set_forward_context(caches, slots):
        result = compiled(positions, hidden)
    counts = mc.match_counts(compiled)
    assert counts["mla_rope_kvcache_fusion" if kind == "mla" else "rope_kvcache_fusion"] == 1, counts
    for what, a, e in zip(("output", "q", "k"), result, expected):
        assert_bitwise(a, e, what)
    for i, (a, e) in enumerate(zip(pools, expected_pools)):
        assert_bitwise(a, e, f"pool {i}")
