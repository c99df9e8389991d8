"""Hypothesis strategies for the cases of CONTRACT §1-§4.

Small ``@st.composite`` strategies that draw shapes first, then everything sized to
fit them, and end in a frozen case (``types.py``) holding parameters and a seed;
tensors are built from the seed later (``tensors.py``), never drawn element by element.
Every strategy shrinks toward the plain case: few tokens, contiguous tensors, a small
plain fp32 table, an ``auto`` cache, unit scales.

Sizes come from ``limits()``: small on the CPU (the Triton interpreter runs every
kernel there); under the ``gpu`` profile (``nightly`` on a GPU, or
``MLA_FUSE_PROPERTY_SIZES=large``) up to the model presets' largest sizes, those exact sizes
included (``declarations/presets.py``). Every profile also runs ``cases/boundaries.py``'s
crossings (``properties/test_real_sizes.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

from hypothesis import strategies as st

from mla_fuse_conformance.declarations.dtypes import (FLOAT_DTYPES, FP8_CACHE_DTYPES, FP8_FORMAT_OF_KV_CACHE_DTYPE,
                                                       FP8_FORMATS, FP8_STORAGES, INDEX_DTYPES)
from mla_fuse_conformance.declarations.operations import FAMILY_OF_OPERATION, FUSED_OPERATIONS, OPERATIONS
from mla_fuse_conformance.declarations.presets import SERVING, largest, values_of
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.cases.types import (BadInputCase, FlashCase, MlaCase, Placement, PositionSpec, RopeCase, ScaleSpec,
                                  SlotSpec, TableSpec, ValueSpec)

SIZES_ENV_VAR = "MLA_FUSE_PROPERTY_SIZES"
# log2 of each fp8 cache dtype's finite max (8.8, 15.8), to aim values below, at and past saturation
FP8_LOG2_MAX = {name: round(math.log2(FP8_FORMATS[fmt]), 1) for name, fmt in FP8_FORMAT_OF_KV_CACHE_DTYPE.items()}


@dataclasses.dataclass(frozen=True)
class Limits:
    max_tokens: int
    max_heads: int
    max_kv_heads: int
    max_head_size: int
    max_rotary_dim: int
    max_latent: int
    max_nope: int
    max_extra_blocks: int
    block_sizes: tuple[int, ...]
    max_full_table_rows: int
    large_table_rows: tuple[int, ...]  # poisoned (sparse) tables: only the rows read are computed
    yarn_original_positions: tuple[int, ...]
    large_pool_elements: int  # a large pool puts the cache view past this many elements (2^16 and more)
    model_sizes: bool = False  # also draw the exact sizes of the model presets and serving engines


SMALL = Limits(max_tokens=40, max_heads=5, max_kv_heads=3, max_head_size=40, max_rotary_dim=32, max_latent=64,
               max_nope=16, max_extra_blocks=4, block_sizes=(1, 2, 3, 4, 5, 8, 16, 32), max_full_table_rows=4096,
               large_table_rows=(2 ** 15 + 3, 2 ** 17), yarn_original_positions=(16, 32, 64, 2048),
               large_pool_elements=2 ** 16 + 2 ** 12)
# the gpu and nightly profiles: up to the largest size of any model preset or serving engine
# (declarations/presets.py), and those exact sizes drawn as ordinary cases (model_sizes)
LARGE = Limits(max_tokens=largest("tokens"), max_heads=largest("heads"), max_kv_heads=largest("kv_heads"),
               max_head_size=largest("head_size"), max_rotary_dim=largest("rotary_dim"),
               max_latent=largest("latent"), max_nope=largest("nope"), max_extra_blocks=64,
               block_sizes=tuple(sorted({*SERVING.block_sizes, 3, 5, 48})), max_full_table_rows=8192,
               large_table_rows=(2 ** 17, largest("table_rows"), 2 ** 20), yarn_original_positions=(64, 512, 4096),
               large_pool_elements=2 ** 24, model_sizes=True)


@functools.cache
def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def limits() -> Limits:
    """Sizes for the current run: ``$MLA_FUSE_PROPERTY_SIZES`` (small/large), else by profile
    (``gpu``, and ``nightly`` where a GPU is present: large)."""
    choice = os.environ.get(SIZES_ENV_VAR)
    if choice is None:
        large = profiles.current() == "gpu" or (profiles.current() == "nightly" and _has_gpu())
        choice = "large" if large else "small"
    return LARGE if choice == "large" else SMALL


def weighted(*options_and_weights):
    """``sampled_from`` with whole-number weights, shrinking toward the first option."""
    return st.sampled_from([option for option, weight in options_and_weights for _ in range(weight)])


def sizes(field: str, low: int, high: int, unit: int = 1):
    """Any size in ``[low, high]``; with ``model_sizes``, also (one time in four) a size some model
    preset has in ``field`` at some TP degree, divided by ``unit`` (shrinks toward ``low``)."""
    anything = st.integers(low, high)
    used = [value // unit for value in values_of(field) if low <= value // unit <= high and not value % unit] \
        if limits().model_sizes else []
    return st.one_of(anything, anything, anything, st.sampled_from(used)) if used else anything


seeds = st.integers(0, 2 ** 32 - 1)
dtypes = st.sampled_from(FLOAT_DTYPES)
index_dtypes = st.sampled_from(INDEX_DTYPES)


@st.composite
def token_counts(draw, max_tokens: int | None = None, min_tokens: int = 0) -> int:
    """T: 0, 1, small, and anywhere up to the limit (so every kernel block-size tail shows up)."""
    top = max_tokens if max_tokens is not None else limits().max_tokens
    kind = draw(weighted(("any", 4), ("few", 2), ("one", 1), ("zero", 1)))
    if kind == "zero" and min_tokens == 0:
        return 0
    if kind == "one" and min_tokens <= 1:
        return 1
    low = min(max(min_tokens, 2), top)  # 0 and 1 come from their own branches, not by chance
    if kind == "few":
        return draw(st.integers(low, min(top, max(low, 8))))
    if limits().model_sizes and draw(st.booleans()):  # a decode batch, or a prefill chunk up to the limit
        decode_low, decode_high = SERVING.decode_tokens
        return draw(st.integers(max(low, decode_low), min(top, decode_high)))
    return draw(st.integers(low, top))


@st.composite
def rotary_dims(draw, max_dim: int) -> int:
    return 2 * draw(sizes("rotary_dim", 1, max(max_dim // 2, 1), unit=2))


# ---------------------------------------------------------------- tables and indices


@st.composite
def tables(draw, rotary_dim: int) -> TableSpec:
    """Plain or DeepSeek YaRN tables, fp32 or the input dtype; small, medium, or large and poisoned."""
    lim = limits()
    style = draw(st.sampled_from(("plain", "deepseek_yarn")))
    dtype = draw(st.sampled_from(("float32", "input")))
    size = draw(weighted(("small", 3), ("medium", 1), ("large", 1)))
    poison = draw(st.booleans())
    if style == "plain":
        rows = {"small": st.integers(1, 64), "medium": st.integers(65, lim.max_full_table_rows),
                "large": st.sampled_from(lim.large_table_rows)}[size]
        max_position = draw(rows)
        base = draw(st.sampled_from((10000.0, 500.0, 1e6)))
        return TableSpec("plain", rotary_dim, max_position, dtype, base,
                         poison_unused_rows=poison or max_position > lim.max_full_table_rows)
    original = draw(st.sampled_from(lim.yarn_original_positions))
    factor = draw(st.sampled_from((4.0, 40.0, 1.5, 2.0)))
    if size == "small":
        original, factor = min(original, 32), min(factor, 4.0)
    return TableSpec(
        "deepseek_yarn", rotary_dim, original, dtype, draw(st.sampled_from((10000.0, 500.0))), factor,
        yarn_mscale=draw(st.sampled_from((1.0, 0.707))), yarn_mscale_all_dim=draw(st.sampled_from((0.0, 1.0, 0.707))),
        yarn_attn_factor=draw(st.sampled_from((1.0, 0.5))),
        poison_unused_rows=poison or original * factor > lim.max_full_table_rows)


@st.composite
def position_specs(draw) -> PositionSpec:
    return PositionSpec(draw(index_dtypes), draw(st.sampled_from(("uniform", "prefill", "last_rows", "zeros"))),
                        draw(weighted((1, 4), (2, 1), (3, 1))))


@st.composite
def slot_specs(draw, tokens: int, full_length: bool = False) -> SlotSpec:
    """Any padding pattern; ``slot_mapping`` as long as T or shorter (graph padding)."""
    length = tokens if full_length or not draw(st.booleans()) else draw(st.integers(0, tokens))
    return SlotSpec(length, draw(st.sampled_from(("none", "some", "all"))), draw(st.sampled_from((0.5, 0.1, 0.9))),
                    draw(weighted((-1, 3), (-2, 1))), draw(st.sampled_from(("random", "prefill", "extremes"))),
                    draw(index_dtypes), draw(weighted((1, 4), (2, 1))))


@st.composite
def block_geometry(draw, tokens: int) -> tuple[int, int]:
    """``(NB, B)`` with room for every token plus spare slots (unused slots must stay untouched)."""
    block_size = draw(st.sampled_from(limits().block_sizes))
    least = math.ceil((tokens + 1) / block_size)
    return draw(st.integers(least, least + limits().max_extra_blocks)), block_size


# ---------------------------------------------------------------- memory placement


@st.composite
def placements(draw, rank: int, *, permute_outer: bool = False, inner_offset: int = 0, max_pad: int = 3,
               max_lead: int = 7, always: bool = False) -> Placement:
    """A strided view of a larger parent: padded dims, an offset start, a storage offset, and
    (``permute_outer``) the outer dims in any memory order. ``inner_offset`` columns precede
    the view (``q[..., nope:]``)."""
    if not always and not inner_offset and not draw(st.booleans()):
        return Placement()
    pad = [draw(st.integers(0, max_pad)) for _ in range(rank)]
    if not any(pad):  # a strided view: rows (or heads) padded, so every outer stride grows
        pad[-1] = draw(st.integers(1, max_pad))
    offset = [draw(st.integers(0, p)) for p in pad]
    pad[-1] += inner_offset
    offset[-1] += inner_offset
    order = tuple(range(rank))
    if permute_outer:
        order = tuple(draw(st.permutations(list(range(rank - 1))))) + (rank - 1,)
    return Placement(tuple(pad), tuple(offset), order, draw(st.integers(0, max_lead)), draw(st.integers(0, 5)))


@st.composite
def cache_placements(draw, rank: int, permute_outer: bool, block_elements: int) -> Placement:
    """A cache view in a pool: contiguous, strided, or in a large pool at its far end, past
    ``large_pool_elements`` (addresses that overflow a narrow index type)."""
    kind = draw(st.sampled_from(("plain", "strided", "large pool")))
    if kind == "plain":
        return Placement()
    place = draw(placements(rank, permute_outer=permute_outer, always=True))
    if kind == "large pool":
        least = limits().large_pool_elements // block_elements + 1
        extra = draw(st.integers(least, 2 * least))
        pad = (place.pad[0] + extra, *place.pad[1:])
        offset = (place.offset[0] + extra - draw(st.integers(0, 2)), *place.offset[1:])
        place = dataclasses.replace(place, pad=pad, offset=offset)
    return place


def layouts():
    """How q, k (and v) sit in memory: ``separate`` tensors, each maybe strided; ``packed``
    column slices of one qkv; or ``q strided`` (q padded or a slice, k and v contiguous)."""
    return st.sampled_from(("separate", "packed", "q strided"))


# ---------------------------------------------------------------- values and scales


@st.composite
def value_specs(draw, kv_cache_dtype: str = "auto", scale: ScaleSpec | None = None) -> ValueSpec:
    """Magnitudes from tiny to large; for fp8 caches, relative to the scale: underflow to zero,
    ordinary codes, and past the finite max (saturation), with values on rounding midpoints."""
    spread = draw(st.sampled_from((2.0, 0.0, 6.0)))
    nan_count = draw(weighted((0, 5), (1, 1), (3, 1)))
    if kv_cache_dtype not in FP8_CACHE_DTYPES:
        return ValueSpec(float(draw(st.integers(-12, 12))), spread, nan_count)
    scale_log2 = 0.0 if scale is None else scale.log2
    above_max = draw(st.integers(-14, 6))  # log2(|x| / scale) - log2(fp8 max)
    magnitude = scale_log2 + FP8_LOG2_MAX[kv_cache_dtype] + above_max
    midpoints = draw(st.sampled_from((0.0, 0.5, 1.0, 0.1)))
    return ValueSpec(float(magnitude), spread, nan_count, midpoints)


@st.composite
def scale_specs(draw, per_head_allowed: bool = False) -> ScaleSpec:
    """Unit, tiny, large, non-power-of-two, per-head."""
    log2 = draw(weighted((0, 2), (None, 3)))
    if log2 is None:
        log2 = draw(st.integers(-20, 12))
    mantissa = draw(st.sampled_from((1.0, 1.37109375, 1.9, 1.1, 1.0009765625)))
    per_head = per_head_allowed and draw(st.booleans())
    return ScaleSpec(float(log2), mantissa, per_head)


@st.composite
def cache_formats(draw, dtype: str) -> tuple[str, str]:
    """``(kv_cache_dtype, cache_storage)``: ``auto`` or the named dtype (source bits), or fp8 in
    uint8 or float8 storage."""
    kv_cache_dtype = draw(st.sampled_from(("auto", dtype, *FP8_CACHE_DTYPES)))
    storage = "source" if kv_cache_dtype not in FP8_CACHE_DTYPES else draw(st.sampled_from(FP8_STORAGES))
    return kv_cache_dtype, storage


# ---------------------------------------------------------------- cases


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
