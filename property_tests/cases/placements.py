"""Strategies for where a case's tensors sit in memory: strided views of larger parents, cache views
in a pool (also past a narrow index type's reach), and how q, k and v are laid out."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from mla_fuse_conformance.cases.sizes import limits
from mla_fuse_conformance.cases.types import Placement


@st.composite
def placements(draw, rank: int, *, permute_outer: bool = False, inner_offset: int = 0, max_pad: int = 3,
               max_lead: int = 7, always: bool = False) -> Placement:
    """A strided view of a larger parent: padded dims, an offset start, a storage offset, and
    (``permute_outer``) the outer dims in any memory order. ``inner_offset`` columns precede
    the view (``q[..., nope:]``)."""
    if not always and not inner_offset and not draw(st.booleans()):
        return Placement() if draw(st.booleans()) else Placement(lead=draw(storage_offsets(max_lead)))
    pad = [draw(st.integers(0, max_pad)) for _ in range(rank)]
    if not any(pad):  # a strided view: rows (or heads) padded, so every outer stride grows
        pad[-1] = draw(st.integers(1, max_pad))
    offset = [draw(st.integers(0, p)) for p in pad]
    pad[-1] += inner_offset
    offset[-1] += inner_offset
    order = tuple(range(rank))
    if permute_outer:
        order = tuple(draw(st.permutations(list(range(rank - 1))))) + (rank - 1,)
    return Placement(tuple(pad), tuple(offset), order, draw(storage_offsets(max_lead)), draw(st.integers(0, 5)))


def storage_offsets(max_lead: int = 7):
    """Elements before a view's buffer: ``0..max_lead`` (a start off 16 bytes for every dtype: a slice
    of a fused projection) or 8, 16, 32 (16-, 32-, 64-byte aligned for 2-byte dtypes), so that each
    alignment (``alignment_axes``) is drawn, a misaligned one most often."""
    return st.one_of(st.integers(0, max_lead), st.sampled_from((8, 16, 32)))


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
