"""Hypothesis strategies for the cases of CONTRACT §1-§4, one per operation family, and the
small valid cases a bad-input property corrupts.

Small ``@st.composite`` strategies that draw shapes first (``sizes.py``), then everything sized to
fit them (``indices.py``, ``placements.py``, ``values.py``), and end in a frozen case (``types.py``)
holding parameters and a seed; tensors are built from the seed later (``tensors.py``), never drawn
element by element. Every strategy shrinks toward the plain case: few tokens, contiguous tensors, a
small plain fp32 table, an ``auto`` cache, unit scales.
"""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import strategies as st

from mla_fuse_conformance.cases.corruptions import CORRUPTIONS
from mla_fuse_conformance.cases.deployment_cases import deployment_cases, engine_placements
from mla_fuse_conformance.cases.indices import position_specs, slot_specs, tables
from mla_fuse_conformance.cases.placements import cache_placements, layouts, placements
from mla_fuse_conformance.cases.sizes import block_geometry, limits, rotary_dims, sizes, token_counts, weighted
from mla_fuse_conformance.cases.types import (BadInputCase, FlashCase, MlaCase, Placement, PositionSpec, RopeCase,
                                              SlotSpec, TableSpec)
from mla_fuse_conformance.cases.values import cache_formats, dtypes, scale_specs, value_specs
from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS
from mla_fuse_conformance.declarations.layout_types import KV_FORMS
from mla_fuse_conformance.declarations.operations import FAMILY_OF_OPERATION, FUSED_OPERATIONS, OPERATIONS

seeds = st.integers(0, 2 ** 32 - 1)
# NeoX halves twice as often as GPT-J pairs, as MHA models run them (every preset but GLM-4's,
# declarations/presets.py); GPT-J first: a failure shrinks toward it where it can
neox_styles = weighted((False, 1), (True, 2))


# ---------------------------------------------------------------- engines' layouts and deployments


def engine_layouts(operation: str, attention: str) -> tuple[str, ...]:
    """The ``engine_layouts.LAYOUTS`` that pass ``operation``'s inputs on ``attention`` models."""
    return tuple(name for name, layout in LAYOUTS.items() if layout.attention == attention
                 and any(operation in view.operations for view in layout.views))


@st.composite
def engine_views(draw, operation: str, attention: str, sizes: dict[str, int]):
    """``(layout, {argument: Placement})``: an engine's layout for ``operation`` at ``sizes``
    (``q_lora_rank`` drawn small), or ``(None, {})`` (the drawn placements stay)."""
    names = engine_layouts(operation, attention)
    if not names or not draw(weighted((False, 3), (True, 1))):
        return None, {}
    layout = LAYOUTS[draw(st.sampled_from(names))]
    sizes = dict(sizes, q_lora_rank=draw(st.integers(0, 8)))
    return layout, engine_placements(layout, operation, sizes)


@functools.lru_cache(maxsize=None)
def _deployed(operation: str) -> list:
    """The suite's deployments' cases of ``operation``, built once (20 ms: not on every draw)."""
    return list(deployment_cases(operation).values())


def deployments_drawn(operation: str, max_tokens: int | None):
    """Under model sizes (the ``gpu`` profile), one case in eight is a named deployment's."""
    if not limits().model_sizes or max_tokens is not None:
        return st.none()
    cases = _deployed(operation)
    if not cases:
        return st.none()
    return weighted((False, 7), (True, 1)).flatmap(lambda chosen: st.sampled_from(cases) if chosen else st.none())


@st.composite
def rope_cases(draw, max_tokens: int | None = None, min_tokens: int = 0) -> RopeCase:
    """``rotary_embedding``: q (and k, or none), rank 2 or 3, partial rotary, packed or strided."""
    deployed = draw(deployments_drawn("rotary_embedding", max_tokens))
    if deployed is not None:
        return deployed
    lim = limits()
    tokens = draw(token_counts(max_tokens, min_tokens))
    heads = draw(sizes("heads", 1, lim.max_heads))
    kv_heads = draw(sizes("kv_heads", 1, lim.max_kv_heads)) if draw(weighted((True, 3), (False, 1))) else 0
    head_size = draw(sizes("head_size", 2, lim.max_head_size))
    rotary_dim = draw(rotary_dims(min(head_size, lim.max_rotary_dim), engine_widths=True))
    rank = draw(st.sampled_from((3, 2)))
    layout = draw(layouts())
    place = placements(2 if layout == "packed" or rank == 2 else 3, always=layout != "separate")
    query_place = draw(place)
    key_place = draw(place) if layout == "separate" else Placement()
    case = RopeCase(
        seed=draw(seeds), tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=head_size, dtype=draw(dtypes),
        is_neox=draw(neox_styles), table=draw(tables(rotary_dim)), positions=draw(position_specs()), rank=rank,
        qkv_packed=layout == "packed", query_place=query_place, key_place=key_place, values=draw(value_specs()),
        check_values=draw(st.booleans()))
    # drawn last, so that the fields above are drawn as before they were added
    engine, places = draw(engine_views("rotary_embedding", "mha", dict(
        tokens=tokens, heads=heads, kv_heads=kv_heads or 1, head_size=head_size, rotary_dim=rotary_dim)))
    if engine is None or not kv_heads:
        return case
    query = next(v for v in engine.views if v.argument == "query" and "rotary_embedding" in v.operations)
    # an engine's q and k: [T, n*D] columns of qkv, or [T, n, R] heads sliced to the rotary width
    return dataclasses.replace(case, rank=len(query.shape), qkv_packed=False, query_place=places["query"],
                               key_place=places["key"],
                               head_size=rotary_dim if query.shape[-1] == "rotary_dim" else head_size)


@st.composite
def mla_cases(draw, fused: bool = True, max_tokens: int | None = None, min_tokens: int = 0) -> MlaCase:
    """Both MLA operations; ``fused=False`` keeps the rope-only fields minimal. Each input placed on
    its own, packed, or as an engine passes it (vLLM: a contiguous kv_c, k_pe split from a projection)."""
    operation = "concat_and_cache_mla_rope_fused" if fused else "concat_and_cache_mla"
    deployed = draw(deployments_drawn(operation, max_tokens))
    if deployed is not None:
        return deployed
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
    case = MlaCase(
        seed=draw(seeds), tokens=tokens, heads=heads, latent=latent, rotary_dim=rotary_dim, dtype=dtype,
        kv_cache_dtype=kv_cache_dtype, num_blocks=num_blocks, block_size=block_size,
        slots=draw(slot_specs(tokens, full_length=min_tokens > 0)),
        table=draw(tables(rotary_dim)) if fused else TableSpec("plain", rotary_dim, 1),
        is_neox=draw(st.booleans()) if fused else False, cache_storage=storage,
        positions=draw(position_specs()) if fused else PositionSpec(),
        q_place=draw(placements(3, inner_offset=nope)) if fused else Placement(),
        kv_packed=draw(st.booleans()), kv_c_place=draw(placements(2)),
        cache_place=draw(cache_placements(3, permute_outer=True,
                                          block_elements=block_size * (latent + rotary_dim))),
        values=draw(value_specs(kv_cache_dtype, scale)), scale=scale, check_values=draw(st.booleans()))
    # drawn last, so that the fields above are drawn as before they were added
    if not case.kv_packed:  # k_pe on its own: any placement, independent of kv_c's
        case = dataclasses.replace(case, k_pe_place=draw(placements(2)))
    engine, places = draw(engine_views(operation, "mla", dict(
        tokens=tokens, heads=heads, latent=latent, rotary_dim=rotary_dim, nope=nope)))
    if engine is None:
        return case
    return dataclasses.replace(case, kv_packed=False, kv_c_place=places["kv_c"], k_pe_place=places["k_pe"],
                               q_place=places.get("q_pe", case.q_place) if fused else case.q_place)


@st.composite
def flash_cases(draw, fused: bool = True, max_tokens: int | None = None, min_tokens: int = 0) -> FlashCase:
    """Both MHA operations: GQA heads, partial rotary, NHD/HND caches in each K/V form, per-head scales;
    q, k and v each placed on its own, packed, or as an engine passes them."""
    operation = "rope_and_reshape_and_cache_flash" if fused else "reshape_and_cache_flash"
    deployed = draw(deployments_drawn(operation, max_tokens))
    if deployed is not None:
        return deployed
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
    case = FlashCase(
        seed=draw(seeds), tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=head_size,
        value_head_size=value_head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, num_blocks=num_blocks,
        block_size=block_size, slots=draw(slot_specs(tokens, full_length=min_tokens > 0)),
        table=draw(tables(rotary_dim)) if fused else TableSpec("plain", rotary_dim, 1),
        is_neox=draw(st.booleans()) if fused else True, cache_storage=storage,
        cache_order=tuple(draw(st.permutations([0, 1, 2]))),
        kv_form="flashinfer" if value_head_size == head_size and draw(st.booleans()) else "split",
        positions=draw(position_specs()) if fused else PositionSpec(), qkv_packed=layout == "packed",
        query_place=query_place, key_place=key_place, value_place=value_place,
        cache_place=draw(cache_placements(4, permute_outer=False,
                                          block_elements=block_size * kv_heads * max(head_size, value_head_size))),
        values=draw(value_specs(kv_cache_dtype, k_scale)), value_values=draw(value_specs(kv_cache_dtype, v_scale)),
        k_scale=k_scale, v_scale=v_scale, check_values=draw(st.booleans()))
    # drawn last, so that the fields above are drawn as before they were added
    if case.kv_form != "split":  # one pool: K/V side by side per block, outermost, or per head row
        case = dataclasses.replace(case, kv_form=draw(st.sampled_from(tuple(f for f in KV_FORMS if f != "split"))))
    engine, places = draw(engine_views(operation, "mha", dict(
        tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=head_size, value_head_size=value_head_size,
        rotary_dim=rotary_dim)))
    if engine is None:  # else q/k/v as [T, n, D] views of the qkv projection, or the caller's own tensors
        return case
    return dataclasses.replace(
        case, qkv_packed=False, query_place=places.get("query", case.query_place), key_place=places["key"],
        value_place=places["value"], kv_form=engine.cache.kv if value_head_size == head_size else "split")


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
