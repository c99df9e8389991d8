"""``mla_fuse.overlap`` against brute force: every byte of small strided views, enumerated."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mla_fuse import overlap

STORAGE = torch.zeros(4096, dtype=torch.uint8)
DTYPE_OF_ITEMSIZE = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32}


def element_offsets(shape, strides, offset):
    return [offset + sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape))]


def covered_bytes(view: torch.Tensor) -> set[int]:
    base = view.data_ptr() - STORAGE.data_ptr()
    width = view.element_size()
    return {base + e * width + u for e in element_offsets(view.shape, view.stride(), 0) for u in range(width)}


@st.composite
def views(draw, itemsize=None):
    """A strided view of any layout (zero strides, interleaving, overlapping) into ``STORAGE``."""
    itemsize = itemsize or draw(st.sampled_from(sorted(DTYPE_OF_ITEMSIZE)))
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(0, 4)) for _ in range(ndim)]
    strides = [draw(st.integers(0, 12)) for _ in range(ndim)]
    typed = STORAGE.view(DTYPE_OF_ITEMSIZE[itemsize])
    return torch.as_strided(typed, shape, strides, draw(st.integers(0, 40)))


@st.composite
def boxes_of_one_parent(draw):
    """Two sub-boxes of one parent tensor (the layouts of packed projections and pooled caches)."""
    itemsize = draw(st.sampled_from(sorted(DTYPE_OF_ITEMSIZE)))
    parent_shape = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(1, 3)))]
    order = draw(st.permutations(range(len(parent_shape))))
    parent = STORAGE.view(DTYPE_OF_ITEMSIZE[itemsize])[:torch.Size(parent_shape).numel()].view(
        [parent_shape[d] for d in order]).permute([order.index(d) for d in range(len(order))])

    def box():
        starts = [draw(st.integers(0, size - 1)) for size in parent_shape]
        return parent[tuple(slice(start, draw(st.integers(start, size))) for start, size in zip(starts, parent_shape))]

    return box(), box()


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.tuples(views(), views()), boxes_of_one_parent()))
def test_two_views_overlap_exactly_when_a_byte_is_shared(pair):
    a, b = pair
    expected = bool(covered_bytes(a) & covered_bytes(b))
    assert overlap.tensors_overlap(a, b) == expected
    assert overlap.tensors_overlap(b, a) == expected


@settings(max_examples=400, deadline=None)
@given(views())
def test_internal_overlap_exactly_when_two_indices_share_an_element(view):
    offsets = element_offsets(view.shape, view.stride(), 0)
    assert overlap.has_internal_overlap(view) == (len(set(offsets)) != len(offsets))


def test_the_layouts_the_operations_see():
    kv = torch.empty(64, 576, dtype=torch.bfloat16)  # kv_c | k_pe of one projection
    assert not overlap.tensors_overlap(kv[:, :512], kv[:, 512:])
    assert overlap.tensors_overlap(kv[:, :513], kv[:, 512:])
    pool = torch.empty(10, 16, 2, 8, 128)  # K and V interleaved per block
    assert not overlap.tensors_overlap(pool[:, :, 0], pool[:, :, 1])
    assert overlap.has_internal_overlap(pool[:1, :, 0].expand(10, 16, 8, 128))
    assert not overlap.has_internal_overlap(pool[:, :, 1])
