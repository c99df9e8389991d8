"""Hypothesis strategies for the cases of CONTRACT §1-§4, one per operation family, and the
small valid cases a bad-input property corrupts.

Small ``@st.composite`` strategies that draw shapes first (``sizes.py``), then everything sized to
fit them (``indices.py``, ``placements.py``, ``values.py``), and end in a frozen case (``types.py``)
holding parameters and a seed; tensors are built from the seed later (``tensors.py``), never drawn
element by element. Every strategy shrinks toward the plain case: few tokens, contiguous tensors, a
small plain fp32 table, an ``auto`` cache, unit scales.
"""

from __future__ import annotations

import functools

from hypothesis import strategies as st

from mla_fuse_conformance.cases.indices import position_specs, slot_specs, tables
from mla_fuse_conformance.cases.placements import cache_placements, layouts, placements
from mla_fuse_conformance.cases.sizes import block_geometry, limits, rotary_dims, sizes, token_counts, weighted
from mla_fuse_conformance.cases.types import (BadInputCase, FlashCase, MlaCase, Placement, PositionSpec, RopeCase,
                                              SlotSpec, TableSpec)
from mla_fuse_conformance.cases.values import cache_formats, dtypes, scale_specs, value_specs
from mla_fuse_conformance.declarations.operations import FAMILY_OF_OPERATION, FUSED_OPERATIONS, OPERATIONS

seeds = st.integers(0, 2 ** 32 - 1)


@st.composite
def rope_cases(draw, max_tokens: int | None = None, min_tokens: int = 0) -> RopeCase:
    """``rotary_embedding``: q (and k, or none), rank 2 or 3, partial rotary, packed or strided."""
    lim = limits()
    tokens = draw(token_counts(max_tokens, min_tokens))
    heads = draw(sizes("heads", 1, lim.max_heads))
    kv_heads = draw(sizes("kv_heads", 1, lim.max_kv_heads)) if draw(weighted((True, 3), (False, 1))) else 0
    head_size = draw(sizes("head_size", 2, lim.max_head_size))
    rotary_dim = draw(rotary_dims(min(head_size, lim.max_rotary_dim)))
    rank = draw(st.sampled_from((3, 2)))
    layout = draw(layouts())
    place = placements(2 if layout == "packed" or rank == 2 else 3, always=layout != "separate")
    query_place = draw(place)
    key_place = draw(place) if layout == "separate" else Placement()
    return RopeCase(
        seed=draw(seeds), tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=head_size, dtype=draw(dtypes),
        is_neox=draw(st.booleans()), table=draw(tables(rotary_dim)), positions=draw(position_specs()), rank=rank,
        qkv_packed=layout == "packed", query_place=query_place, key_place=key_place, values=draw(value_specs()),
        check_values=draw(st.booleans()))


@st.composite
def mla_cases(draw, fused: bool = True, max_tokens: int | None = None, min_tokens: int = 0) -> MlaCase:
    """Both MLA operations; ``fused=False`` keeps the rope-only fields minimal."""
    lim = limits()
    tokens = draw(token_counts(max_tokens, min_tokens))
    dtype = draw(dtypes)
    latent = draw(sizes("latent", 1, lim.max_latent))
    rotary_dim = draw(rotary_dims(lim.max_rotary_dim))
    heads = draw(sizes("heads", 1, lim.max_heads)) if fused else 1
    num_blocks, block_size = draw(block_geometry(tokens))
    kv_cache_dtype, storage = draw(cache_formats(dtype))
    scale = draw(scale_specs())
    nope = draw(st.integers(0, lim.max_nope)) if fused else 0
    return MlaCase(
        seed=draw(seeds), tokens=tokens, heads=heads, latent=latent, rotary_dim=rotary_dim, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype, num_blocks=num_blocks, block_size=block_size,
        slots=draw(slot_specs(tokens, full_length=min_tokens > 0)),
        table=draw(tables(rotary_dim)) if fused else TableSpec("plain", rotary_dim, 1),
        is_neox=draw(st.booleans()) if fused else False, cache_storage=storage,
        positions=draw(position_specs()) if fused else PositionSpec(),
        q_place=draw(placements(3, inner_offset=nope)) if fused else Placement(),
        kv_packed=draw(st.booleans()), kv_place=draw(placements(2)),
        cache_place=draw(cache_placements(3, permute_outer=True,
                                          block_elements=block_size * (latent + rotary_dim))),
        values=draw(value_specs(kv_cache_dtype, scale)), scale=scale, check_values=draw(st.booleans()))


@st.composite
def flash_cases(draw, fused: bool = True, max_tokens: int | None = None, min_tokens: int = 0) -> FlashCase:
    """Both MHA operations: GQA heads, partial rotary, NHD/HND and pooled caches, per-head scales."""
    lim = limits()
    tokens = draw(token_counts(max_tokens, min_tokens))
    dtype = draw(dtypes)
    kv_heads = draw(sizes("kv_heads", 1, lim.max_kv_heads))
    heads = kv_heads * draw(st.integers(1, max(lim.max_heads // kv_heads, 1))) if fused else kv_heads
    head_size = draw(sizes("head_size", 2, lim.max_head_size))
    value_head_size = head_size if draw(st.booleans()) else draw(st.integers(1, lim.max_head_size))
    rotary_dim = draw(rotary_dims(min(head_size, lim.max_rotary_dim)))
    num_blocks, block_size = draw(block_geometry(tokens))
    kv_cache_dtype, storage = draw(cache_formats(dtype))
    k_scale = draw(scale_specs(per_head_allowed=True))
    v_scale = k_scale if draw(st.booleans()) else draw(scale_specs(per_head_allowed=True))
    layout = draw(layouts())
    place = placements(2 if layout == "packed" else 3, always=layout != "separate")
    query_place = draw(place)
    key_place, value_place = (draw(place), draw(place)) if layout == "separate" else (Placement(), Placement())
    return FlashCase(
        seed=draw(seeds), tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=head_size,
        value_head_size=value_head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, num_blocks=num_blocks,
        block_size=block_size, slots=draw(slot_specs(tokens, full_length=min_tokens > 0)),
        table=draw(tables(rotary_dim)) if fused else TableSpec("plain", rotary_dim, 1),
        is_neox=draw(st.booleans()) if fused else True, cache_storage=storage,
        cache_order=tuple(draw(st.permutations([0, 1, 2]))),
        shared_pool=value_head_size == head_size and draw(st.booleans()),
        positions=draw(position_specs()) if fused else PositionSpec(), qkv_packed=layout == "packed",
        query_place=query_place, key_place=key_place, value_place=value_place,
        cache_place=draw(cache_placements(4, permute_outer=False,
                                          block_elements=block_size * kv_heads * max(head_size, value_head_size))),
        values=draw(value_specs(kv_cache_dtype, k_scale)), value_values=draw(value_specs(kv_cache_dtype, v_scale)),
        k_scale=k_scale, v_scale=v_scale, check_values=draw(st.booleans()))


def base_cases(operation: str):
    """Small valid cases of ``operation`` (2-6 tokens), the ones a bad-input property corrupts."""
    family = FAMILY_OF_OPERATION[operation]
    if family == "rope":
        return rope_cases(max_tokens=6, min_tokens=2)
    cases = mla_cases if family == "mla" else flash_cases
    return cases(fused=operation in FUSED_OPERATIONS, max_tokens=6, min_tokens=2)


# operation -> a strategy of its small valid cases
BASE_CASES = {op: functools.partial(base_cases, op) for op in OPERATIONS}


@st.composite
def bad_input_cases(draw, operation: str, corruption: str | None = None) -> BadInputCase:
    """A small valid case for ``operation`` with one named corruption (``corruptions.py``)."""
    from mla_fuse_conformance.cases.corruptions import CORRUPTIONS

    if corruption is None:
        corruption = draw(st.sampled_from(sorted(CORRUPTIONS[operation])))
    return BadInputCase(operation, corruption, draw(BASE_CASES[operation]()))


# ---------------------------------------------------------------- edge cases every profile runs


def edge_cases(kind: str) -> list:
    """T = 0 and T = 1 (written, and padded), as explicit examples: random generation reaches
    them often, but not in every short derandomized run."""
    table = TableSpec("plain", 4, 8)
    if kind == "rope":
        return [RopeCase(seed=1, tokens=tokens, heads=2, kv_heads=1, head_size=6, dtype="bfloat16", is_neox=False,
                         table=table) for tokens in (0, 1)]
    slots = [SlotSpec(0), SlotSpec(1), SlotSpec(1, padding="all")]
    if kind == "mla":
        return [MlaCase(seed=1, tokens=s.length, heads=2, latent=3, rotary_dim=4, dtype="float16",
                        kv_cache_dtype="fp8_e4m3", num_blocks=2, block_size=2, slots=s, table=table,
                        cache_storage="uint8") for s in slots]
    return [FlashCase(seed=1, tokens=s.length, heads=2, kv_heads=1, head_size=6, value_head_size=5,
                      dtype="float32", kv_cache_dtype="auto", num_blocks=2, block_size=2, slots=s, table=table)
            for s in slots]
