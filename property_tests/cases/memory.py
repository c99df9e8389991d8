"""Allocations filled with sentinel bits, and the strided views the operations receive.

Every tensor an operation sees is a view into a ``Buffer``: a flat allocation whose
bytes start as a seeded random pattern (the sentinel: never zeros, so a stray zero
write shows). After the operation the whole buffer is compared, so writes outside
the view, into the wrong view, or into a copy are all visible.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import torch

INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def generator(seed: int, purpose: str) -> torch.Generator:
    """A CPU generator for one named purpose of a case: tensors do not shift when others change size."""
    return torch.Generator().manual_seed((seed * 0x9E3779B1 + zlib.crc32(purpose.encode())) % (2 ** 63))


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bits of ``tensor`` as a same-sized integer dtype (for bitwise comparisons)."""
    return tensor.view(INT_OF_SIZE[tensor.element_size()])


def row_major_strides(shape, order=()) -> tuple[int, ...]:
    """Strides of a dense tensor of ``shape`` whose dims are laid out ``order`` (outermost first)."""
    order = tuple(order) or tuple(range(len(shape)))
    strides = [0] * len(shape)
    running = 1
    for dim in reversed(order):
        strides[dim] = running
        running *= max(shape[dim], 1)
    return tuple(strides)


@dataclasses.dataclass(frozen=True)
class View:
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


class Buffer:
    """One flat allocation of ``dtype`` on ``device`` holding named views."""

    def __init__(self, name: str, numel: int, dtype: torch.dtype, device, seed: int, fill=None):
        self.name = name
        self.dtype = dtype
        self.views: dict[str, View] = {}
        numel = max(numel, 1)
        if fill is None:
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator(seed, "sentinel:" + name))
            raw[0] |= 1  # never all zero
            flat = raw.view(dtype)
        else:
            flat = torch.full((numel,), fill, dtype=dtype)
        self.flat = flat.to(device)

    def add_view(self, view_name: str, size, stride, offset: int) -> torch.Tensor:
        size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
        if all(size):  # an empty view touches no element
            last = offset + sum((s - 1) * st for s, st in zip(size, stride))
            assert 0 <= offset and last < self.flat.numel(), f"view {view_name} does not fit in buffer {self.name}"
        self.views[view_name] = View(size, stride, offset)
        return self.view(view_name)

    def view(self, view_name: str, flat: torch.Tensor | None = None) -> torch.Tensor:
        """The named view over this buffer's storage (or over ``flat``, a copy of it)."""
        geometry = self.views[view_name]
        base = self.flat if flat is None else flat
        return torch.as_strided(base, geometry.size, geometry.stride, base.storage_offset() + geometry.offset)

    def index_map(self, view_name: str, *leading: torch.Tensor) -> torch.Tensor:
        """For each element of the view, its index in the flat buffer (CPU int64): ``offset + sum_k i_k *
        stride_k``. With ``leading`` (integer tensors of one shape ``[n]``), only the elements
        ``view[leading[0][m], ..., leading[j][m]]``: ``[n, *the view's other sizes]``. Computed from the
        view's geometry, not over the whole buffer (a cache pool at a real model's size has 10^8
        elements, of which a step writes a few entries)."""
        geometry = self.views[view_name]
        count = len(leading)
        rest = torch.zeros((), dtype=torch.int64)  # the other dims' part, outermost first
        for size, stride in zip(geometry.size[count:], geometry.stride[count:]):
            rest = rest.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
        first = torch.tensor(geometry.offset, dtype=torch.int64)
        for index, stride in zip(leading, geometry.stride):
            first = first + index.long() * stride
        return first.reshape(*first.shape, *[1] * rest.dim()) + rest

    def position(self, flat_index: int) -> tuple[str, list[int]] | None:
        """``(view, index)`` of the first view holding flat element ``flat_index``, or None (sentinel memory)."""
        for view_name in self.views:
            hits = (self.index_map(view_name) == flat_index).nonzero()
            if hits.numel():
                return view_name, [int(i) for i in hits[0]]
        return None

    def locate(self, flat_index: int) -> str:
        """Which view element a flat index is, for messages."""
        found = self.position(flat_index)
        if found is not None:
            return f"{found[0]}[{', '.join(map(str, found[1]))}]"
        return f"{self.name} storage element {flat_index} (outside every view: sentinel memory)"


def placed(name: str, shape, placement, dtype: torch.dtype, device, seed: int,
           fill=None) -> tuple[Buffer, torch.Tensor]:
    """A buffer holding one view of ``shape`` placed as ``placement`` (cases.Placement)."""
    numel, strides, start = placed_geometry(shape, placement)
    buffer = Buffer(name, numel, dtype, device, seed, fill)
    return buffer, buffer.add_view(name, shape, strides, start)


def placed_geometry(shape, placement) -> tuple[int, tuple[int, ...], int]:
    """``(buffer elements, view strides, view start)`` of ``placed``, without allocating."""
    rank = len(shape)
    pad = tuple(placement.pad) + (0,) * (rank - len(placement.pad))
    offset = tuple(placement.offset) + (0,) * (rank - len(placement.offset))
    parent_shape = [shape[d] + pad[d] for d in range(rank)]
    order = tuple(placement.order) if len(placement.order) == rank else tuple(range(rank))
    strides = row_major_strides(parent_shape, order)
    numel = placement.lead + math.prod(max(extent, 1) for extent in parent_shape) + placement.trail
    return numel, strides, placement.lead + sum(o * s for o, s in zip(offset, strides))


def packed(name: str, rows: int, members: dict[str, tuple[int, ...]], placement, dtype, device, seed: int):
    """One ``[rows, columns]`` buffer whose column slices are the members (a fused projection
    output split into q/k/v or kv_c/k_pe). ``members`` maps a view name to its shape past the
    token dim; the views sit side by side after ``placement.offset[1]`` columns."""
    numel, row_stride, starts = packed_geometry(rows, members, placement)
    buffer = Buffer(name, numel, dtype, device, seed)
    views = {member: buffer.add_view(member, (rows, *tail), (row_stride, *row_major_strides(tail)), starts[member])
             for member, tail in members.items()}
    return buffer, views


def packed_geometry(rows: int, members: dict[str, tuple[int, ...]], placement) -> tuple[int, int, dict[str, int]]:
    """``(buffer elements, row stride, {member: view start})`` of ``packed``, without allocating."""
    pad = tuple(placement.pad) + (0, 0)
    offset = tuple(placement.offset) + (0, 0)
    widths = {member: math.prod(tail) for member, tail in members.items()}
    columns = offset[1] + sum(widths.values()) + max(pad[1] - offset[1], 0)
    row_stride = max(columns, 1)
    numel = placement.lead + max(rows + pad[0], 1) * row_stride + placement.trail
    column, starts = offset[1], {}
    for member in members:
        starts[member] = placement.lead + offset[0] * row_stride + column
        column += widths[member]
    return numel, row_stride, starts


def pool_order(kv_form: str, order: tuple[int, ...]) -> tuple[int, ...]:
    """Memory order (outermost first) of a K/V pool ``[NB, B, Hkv, D, 2]``: the K/V dim outermost
    (``flash``), right after the block dim (``flashinfer``) or just inside the head (``halves``)."""
    if kv_form == "flash":
        return (4, *order)
    if kv_form == "flashinfer":
        at = order.index(0) + 1
        return (*order[:at], 4, *order[at:])
    if kv_form == "halves":
        return (*order[:-1], 4, order[-1])
    raise ValueError(f"FlashCase: kv_form {kv_form!r} is not one of split, flash, flashinfer, halves")


def pool_geometry(sizes: tuple[int, int, int, int], place, kv_form: str, order: tuple[int, ...]):
    """``(shape, strides, start)`` of a K/V pool ``[NB, B, Hkv, D, 2]`` holding two caches of
    ``sizes`` (``NB, B, Hkv, D``), padded and offset as ``place`` says, in ``pool_order(kv_form,
    order)``; the key cache starts at ``start``, the value cache one ``strides[4]`` further."""
    pad = tuple(place.pad) + (0,) * (4 - len(place.pad))
    offset = tuple(place.offset) + (0,) * (4 - len(place.offset))
    shape = tuple(size + extra for size, extra in zip(sizes, pad)) + (2,)
    strides = row_major_strides(shape, pool_order(kv_form, order))
    return shape, strides, place.lead + sum(o * s for o, s in zip(offset, strides))
