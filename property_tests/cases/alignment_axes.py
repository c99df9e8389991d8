"""Where a case is on the alignment axes, and moving it: the byte alignment of each input's rows,
heads and rotated halves, and of each cache's entries (``<axis>_of(case)``, ``set_<axis>(case, value)``;
the axes are declared in ``features.py``).

A value is the largest of 64, 32 and 16 bytes that divides the address of every row start, head
start and rotated-half start of a tensor (NeoX: the halves at 0 and R/2 of a head; GPT-J: the head
start), or ``<16``. It is computed from the case's fields alone, as ``tensors.py`` places each view
(``memory.placed_geometry``, ``memory.packed_geometry``) in a fresh buffer, which the allocator aligns
to at least 64 bytes (CPU: c10's 64-byte alignment; CUDA: 256 or 512). A 16-byte vector store
(8 bf16 values: vLLM CPU's ``vmovdqa``, docs/VLLM_CPU.md) needs ``16`` or better at every vector it
stores. A setter moves the buffer's storage offset (``Placement.lead``) to the value, or returns None
where no storage offset reaches it (strides or half offsets that are not multiples of it).
"""

from __future__ import annotations

import dataclasses
import math

from mla_fuse_conformance.cases.memory import packed_geometry, placed_geometry, pool_geometry
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase

ALIGNMENTS = ("64", "32", "16", "<16")  # bytes; the first that divides every address, simplest first
ALLOCATION_BYTES = 64  # a fresh buffer's start is a multiple of this (the CPU allocator's alignment)
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Where a tensor's rows and heads start, in elements of its buffer: ``start``, and the steps of
    each dim with more than one index; ``halves``: where each rotated half starts within a head."""

    element_bytes: int
    start: int
    steps: tuple[int, ...]
    halves: tuple[int, ...] = (0,)

    def alignment(self) -> str:
        common = math.gcd(self.start, *self.steps, *self.halves) * self.element_bytes
        return next((str(size) for size in (64, 32, 16) if common % size == 0), "<16")


def _steps(strides, sizes) -> tuple[int, ...]:
    return tuple(stride for stride, size in zip(strides, sizes) if size > 1)


def _activations(case) -> dict[str, tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """``{name: (start, strides, sizes)}`` of the inputs, heads split out (``[T, heads, width]``)."""
    if isinstance(case, MlaCase):
        shapes = {"q_pe": (case.heads, case.rotary_dim), "kv_c": (1, case.latent), "k_pe": (1, case.rotary_dim)}
        places = {"q_pe": case.q_place, "kv_c": case.kv_c_place, "k_pe": case.k_pe_place}
        packed = {"kv_c": (case.latent,), "k_pe": (case.rotary_dim,)} if case.kv_packed else {}
        place_of_packed = case.kv_c_place  # the packed [T, L + R] parent (tensors.build_mla)
    else:
        shapes = {"query": (case.heads, case.head_size)}
        if case.kv_heads:
            shapes["key"] = (case.kv_heads, case.head_size)
        if isinstance(case, FlashCase):
            shapes["value"] = (case.kv_heads, case.value_head_size)
        places = {"query": case.query_place, "key": case.key_place,
                  "value": getattr(case, "value_place", None)}
        flat = isinstance(case, RopeCase) and case.rank == 2
        tails = {name: ((heads * width,) if flat else (heads, width)) for name, (heads, width) in shapes.items()}
        packed = tails if case.qkv_packed else {}
        place_of_packed = case.query_place
    out = {}
    if packed:
        _, row_stride, starts = packed_geometry(case.tokens, packed, place_of_packed)
        for name, tail in packed.items():
            out[name] = (starts[name], (row_stride, shapes[name][1], 1), (case.tokens, *shapes[name]))
    for name, (heads, width) in shapes.items():
        if name in out:
            continue
        tail = tails[name] if not isinstance(case, MlaCase) else ((heads, width) if name == "q_pe" else (width,))
        _, strides, start = placed_geometry((case.tokens, *tail), places[name])
        head_stride = strides[1] if len(tail) == 2 else width
        out[name] = (start, (strides[0], head_stride, 1), (case.tokens, heads, width))
    return out


def _input(case, names: tuple[str, ...], rotated: bool) -> Geometry | None:
    views = _activations(case)
    name = next((n for n in names if n in views), None)
    if name is None:
        return None
    start, strides, sizes = views[name]
    rotary = case.rotary_dim if isinstance(case, MlaCase) else case.table.rotary_dim
    halves = (0, rotary // 2) if rotated and case.is_neox else (0,)
    return Geometry(ELEMENT_BYTES[case.dtype], start, _steps(strides[:2], sizes[:2]), halves)


def _cache(case) -> Geometry | None:
    if isinstance(case, RopeCase):
        return None
    element_bytes = 1 if case.kv_cache_dtype.startswith("fp8") else ELEMENT_BYTES[case.dtype]
    if isinstance(case, MlaCase):
        sizes = (case.num_blocks, case.block_size)
        _, strides, start = placed_geometry((*sizes, case.latent + case.rotary_dim), case.cache_place)
        return Geometry(element_bytes, start, _steps(strides, sizes))
    sizes = (case.num_blocks, case.block_size, case.kv_heads)
    if case.kv_form == "split":
        place = dataclasses.replace(case.cache_place, order=tuple(case.cache_order) + (3,))
        _, strides, start = placed_geometry((*sizes, case.head_size), place)
        return Geometry(element_bytes, start, _steps(strides, sizes))
    return Geometry(element_bytes, *_shared_pool(case, sizes))


def _shared_pool(case: FlashCase, sizes) -> tuple[int, tuple[int, ...]]:
    """``(key_cache start, steps)`` in the K/V pool ``case.kv_form`` lays out (``tensors._flash_caches``:
    ``[NB, B, Hkv, D, 2]`` in ``memory.pool_order``); the value cache one K/V step further is a step too."""
    _, strides, start = pool_geometry((*sizes, case.head_size), case.cache_place, case.kv_form,
                                      tuple(case.cache_order) + (3,))
    return start, (*_steps(strides[:3], sizes), strides[4])


def q_alignment_of(case):
    geometry = _input(case, ("query", "q_pe"), rotated=True)
    return geometry.alignment() if geometry else None


def k_alignment_of(case):
    geometry = _input(case, ("key", "k_pe"), rotated=True)
    return geometry.alignment() if geometry else None


def kv_c_alignment_of(case):
    geometry = _input(case, ("kv_c",), rotated=False) if isinstance(case, MlaCase) else None
    return geometry.alignment() if geometry else None


def cache_alignment_of(case):
    geometry = _cache(case)
    return geometry.alignment() if geometry else None


def _lead_setter(of, placement_field):
    """A setter moving the storage offset of the buffer ``placement_field(case)`` names until ``of``
    gives the value (the nearest storage offset within one allocation alignment), or None."""
    def setter(case, value):
        field = placement_field(case)
        place = getattr(case, field)
        base = place.lead - place.lead % ALLOCATION_BYTES
        for lead in sorted(range(base, base + ALLOCATION_BYTES), key=lambda lead: (abs(lead - place.lead), lead)):
            moved = dataclasses.replace(case, **{field: dataclasses.replace(place, lead=lead)})
            if of(moved) == value:
                return moved
        return None
    return setter


def _q_field(case):
    return "q_place" if isinstance(case, MlaCase) else "query_place"


def _k_field(case):
    if isinstance(case, MlaCase):
        return "kv_c_place" if case.kv_packed else "k_pe_place"
    return "query_place" if case.qkv_packed else "key_place"


set_q_alignment = _lead_setter(q_alignment_of, _q_field)
set_k_alignment = _lead_setter(k_alignment_of, _k_field)
set_kv_c_alignment = _lead_setter(kv_c_alignment_of, lambda case: "kv_c_place")
set_cache_alignment = _lead_setter(cache_alignment_of, lambda case: "cache_place")
