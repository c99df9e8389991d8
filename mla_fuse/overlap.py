"""Whether strided tensors share memory, decided from metadata alone (no data read, no device sync).

A tensor covers the bytes ``data_ptr + sum_k i_k * stride_k * itemsize + u`` for every index
``0 <= i_k < size_k`` and ``0 <= u < itemsize``. Two tensors *overlap* when one byte is covered
by both; a tensor *overlaps itself* when two different indices reach the same element (an
``expand``-ed view with a stride of 0, or strides that interleave).

``first_overlap`` runs on every call of an operation, so it does little per call: tensors
whose storages (allocations) do not meet cannot overlap, and that is all most arguments need.
The exact questions that remain (column slices of one projection, K and V views of one pool,
a view that is not contiguous) depend only on sizes, strides, element sizes and the distance
between the two first bytes, and are memoized on them (``functools.lru_cache``): a serving
loop asks the same few again and again.

The exact answer: two boxes of one mixed-radix grid (views of one parent, same strides) meet
when the offset between them, decoded into grid digits, leaves the boxes intersecting in
every dim. Otherwise the question is a bounded linear equation in the indices,
``sum_k c_k x_k = offset``, solved by ``_representable``: variables with equal coefficients
merge into one (the rows of two column slices of one parent become one row difference), then
a depth-first search over the largest coefficient keeps only the values that leave the rest
of the sum reachable. Past ``MAX_SEARCH_NODES`` steps (never met by a real layout) it gives up
with ``TooHard``: may overlap.
"""

from __future__ import annotations

import functools
import math
from typing import Collection

import torch

MAX_SEARCH_NODES = 100_000
MEMO_SIZE = 4096

Box = tuple[tuple[int, ...], tuple[int, ...], int]  # sizes, strides (in elements), element size


class TooHard(Exception):
    """The search gave up: the layouts may overlap."""


def tensors_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some byte belongs to both ``a`` and ``b`` (on one device). Raises ``TooHard``."""
    if 0 in a.shape or 0 in b.shape:
        return False
    return _boxes_overlap(b.data_ptr() - a.data_ptr(), _box(a), _box(b))


def has_internal_overlap(tensor: torch.Tensor) -> bool:
    """Whether two different indices of ``tensor`` reach the same element. Raises ``TooHard``."""
    return 0 not in tensor.shape and not tensor.is_contiguous() and _overlaps_itself(tuple(tensor.shape),
                                                                                     tensor.stride())


def first_overlap(tensors: dict[str, torch.Tensor | None],
                  written: Collection[str]) -> tuple[str, str | None] | None:
    """Of ``tensors`` (the ``written`` ones first, then the read ones), the first written tensor that
    overlaps itself, as ``(name, None)``, or that overlaps a later written tensor or any read one,
    as ``(name, other)``; ``None`` when there is none (``None`` arguments are skipped). Raises
    ``TooHard``."""
    spans = []  # (name, tensor, first and end byte of its allocation), tensors with an element only
    for name, tensor in tensors.items():
        if tensor is not None and tensor.numel():
            storage = tensor.untyped_storage()
            spans.append((name, tensor, storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    for index, (name, tensor, first, end) in enumerate(spans):
        if name not in written:
            break
        if not tensor.is_contiguous() and _overlaps_itself(tuple(tensor.shape), tensor.stride()):
            return name, None
        for other, other_tensor, other_first, other_end in spans[index + 1:]:
            if first < other_end and other_first < end and tensors_overlap(tensor, other_tensor):
                return name, other
    return None


def _box(tensor: torch.Tensor) -> Box:
    return tuple(tensor.shape), tensor.stride(), tensor.element_size()


# ---------------------------------------------------------------- exact answers, memoized on the layout


@functools.lru_cache(maxsize=MEMO_SIZE)
def _boxes_overlap(offset: int, a: Box, b: Box) -> bool:
    """Whether box ``b``, starting ``offset`` bytes after box ``a``, shares a byte with it."""
    if offset >= _byte_reach(a) or -offset >= _byte_reach(b):
        return False
    on_one_grid = _boxes_of_one_grid_meet(offset, a, b)
    return on_one_grid if on_one_grid is not None else _share_a_byte(offset, a, b)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _overlaps_itself(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    dims = sorted((stride, size) for size, stride in zip(shape, strides) if size > 1)
    reach = 1  # elements the smaller strides span
    for stride, size in dims:
        if stride < reach:
            break
        reach += stride * (size - 1)
    else:
        return False  # mixed radix: every index has its own element
    # Two indices that first differ in dim k, at i_k > j_k: the sub-box with i_k - j_k >= 1 in dim k
    # (dims before k at 0, the later ones free) shares an element with the one with 0 there.
    for dim, size in enumerate(shape):
        if size > 1:
            later, later_strides = shape[dim + 1:], strides[dim:]
            if _share_a_byte(strides[dim], ((1, *later), later_strides, 1), ((size - 1, *later), later_strides, 1)):
                return True
    return False


def _byte_reach(box: Box) -> int:
    """Bytes from the first byte of a box past its last one."""
    shape, strides, itemsize = box
    return (sum((size - 1) * stride for size, stride in zip(shape, strides)) + 1) * itemsize


def _boxes_of_one_grid_meet(offset: int, a: Box, b: Box) -> bool | None:
    """Exact when ``a`` and ``b`` are boxes of one mixed-radix grid: the same element size and strides,
    each stride a multiple of the next smaller one, and each box within the grid's range in every
    dim but the outermost. ``None`` when they are not (the general search decides then)."""
    (shape_a, strides, itemsize), (shape_b, strides_b, itemsize_b) = a, b
    if strides != strides_b or itemsize != itemsize_b:
        return None
    offset, misaligned = divmod(offset, itemsize)
    dims = sorted((stride, size_a, size_b) for stride, size_a, size_b in zip(strides, shape_a, shape_b)
                  if size_a > 1 or size_b > 1)
    if misaligned or not dims or dims[0][0] != 1:
        return None
    meet = True
    for (stride, size_a, size_b), (larger, _, _) in zip(dims, dims[1:] + [(0, 0, 0)]):
        if larger:  # offset = sum digit_k * stride_k with digit_k in [0, radix_k) below the outermost dim
            radix, rest = divmod(larger, stride)
            digit = (offset // stride) % radix
            if rest or size_a > radix or digit + size_b > radix:
                return None  # not one grid, or a box wraps into the next digit
            offset -= digit * stride
        else:
            digit = offset // stride
        meet = meet and digit < size_a and digit + size_b > 0
    return meet


def _share_a_byte(offset: int, a: Box, b: Box) -> bool:
    """``sum_k a_k i_k + u - sum_k b_k j_k - v = offset`` has a solution in the index boxes
    (``u``, ``v``: the bytes of one element)."""
    terms: dict[int, tuple[int, int]] = {}  # coefficient -> (lowest, highest) value of its merged variable
    for (shape, strides, itemsize), sign in ((a, 1), (b, -1)):
        for size, stride in zip((*shape, itemsize), (*(s * itemsize for s in strides), 1)):
            coefficient, low, high = sign * stride, 0, size - 1
            if coefficient == 0 or high == 0:
                continue
            if coefficient < 0:
                coefficient, low, high = -coefficient, -high, 0
            old_low, old_high = terms.get(coefficient, (0, 0))
            terms[coefficient] = (old_low + low, old_high + high)
    return _representable(offset, sorted(terms.items(), reverse=True))


def _representable(target: int, terms: list[tuple[int, tuple[int, int]]]) -> bool:
    """Whether ``target = sum c * x`` with each ``x`` an integer in its ``(low, high)``; ``c > 0``
    sorted descending."""
    # what the terms from position k on can reach, and the gcd of their coefficients
    suffix_low, suffix_high, suffix_gcd = [0] * (len(terms) + 1), [0] * (len(terms) + 1), [0] * (len(terms) + 1)
    for k in range(len(terms) - 1, -1, -1):
        coefficient, (low, high) = terms[k]
        suffix_low[k] = suffix_low[k + 1] + coefficient * low
        suffix_high[k] = suffix_high[k + 1] + coefficient * high
        suffix_gcd[k] = math.gcd(suffix_gcd[k + 1], coefficient)
    nodes = 0

    def search(k: int, rest: int) -> bool:
        nonlocal nodes
        nodes += 1
        if nodes > MAX_SEARCH_NODES:
            raise TooHard(f"no answer after {MAX_SEARCH_NODES} steps")
        if not suffix_low[k] <= rest <= suffix_high[k] or (suffix_gcd[k] and rest % suffix_gcd[k]):
            return False
        if k == len(terms):
            return rest == 0
        coefficient, (low, high) = terms[k]
        # keep rest - coefficient * x within what the smaller terms reach
        first = max(low, -((suffix_high[k + 1] - rest) // coefficient))
        last = min(high, (rest - suffix_low[k + 1]) // coefficient)
        return any(search(k + 1, rest - coefficient * x) for x in range(first, last + 1))

    return search(0, target)
