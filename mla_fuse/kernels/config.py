"""Launch configuration: how many tokens and heads one program handles, per backend.

* Interpreter (CPU): every program costs a fixed Python overhead per Triton
  operation, so a program takes a large block of tokens and all heads (a tile
  of up to ``INTERPRETER_TILE_ELEMENTS`` elements) and the grid stays tiny.
* GPU: one token per program while that still gives every SM several
  programs, a few tokens per program for long prefills; heads are split so a
  program's rotary tile stays near ``GPU_TILE_ELEMENTS`` elements (registers).

Each kernel module memoizes its launch configuration (grid, tiles, warps, constexprs) per layout
with ``functools.lru_cache(LAUNCH_CACHE_SIZE)`` on a pure function of the sizes and formats: a
serving loop calling again with the same layout pays one cache lookup.
"""

from __future__ import annotations

import triton

import torch

from mla_fuse.kernels import INTERPRETED

INTERPRETER_TILE_ELEMENTS = 1 << 18
GPU_TILE_ELEMENTS = 4096
GPU_LONG_PREFILL_TOKENS = 4096

#: Compile options of every launch. No FMA contraction: ``a*c - b*s`` is two
#: IEEE products and one IEEE difference on GPU as under the interpreter, so
#: both backends give the same bits (and fused == unfused trivially).
COMPILE_OPTIONS = {"enable_fp_fusion": False}
#: The vector width the kernels are written for: a 16-byte global load/store.
VECTOR_BYTES = 16
#: Layouts remembered per kernel (one per distinct token count, head count, size and format).
LAUNCH_CACHE_SIZE = 4096


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def token_block(num_tokens: int, elements_per_token: int) -> int:
    """Tokens per program (a power of two)."""
    elements_per_token = max(elements_per_token, 1)
    if INTERPRETED:
        cap = _floor_pow2(INTERPRETER_TILE_ELEMENTS // elements_per_token)
        return max(1, min(triton.next_power_of_2(max(num_tokens, 1)), cap))
    if num_tokens < GPU_LONG_PREFILL_TOKENS:
        return 1
    return max(1, min(4, _floor_pow2(GPU_TILE_ELEMENTS // elements_per_token)))


def heads_per_program(num_heads: int, elements_per_head: int) -> int:
    """Heads per program: all of them on the interpreter, a register-sized block on GPU."""
    if INTERPRETED or num_heads == 0:
        return max(num_heads, 1)
    per_program = max(1, _floor_pow2(GPU_TILE_ELEMENTS // max(elements_per_head, 1)))
    return min(num_heads, per_program)


def num_warps(tile_elements: int) -> int:
    """Warps for a program whose largest tile has ``tile_elements`` elements."""
    if tile_elements >= 8192:
        return 8
    if tile_elements >= 2048:
        return 4
    return 2


def block(size: int) -> int:
    """The power-of-two tile width covering ``size`` elements (at least 1)."""
    return triton.next_power_of_2(max(size, 1))


def aligned(*byte_values: int) -> bool:
    """Whether every row a kernel moves as vectors starts on a ``VECTOR_BYTES`` boundary: every
    value (the tensors' addresses; strides and in-row offsets times the element size) is a
    multiple of it. Per call (addresses are not part of a layout); one OR and one test.

    ``element_size * (a | b | ...)`` stands for all of ``element_size * a``, ... at once: element
    sizes are powers of two, so each product is a multiple of 16 exactly when ``a | b | ...`` is
    a multiple of ``16 / element_size``.
    """
    combined = 0
    for value in byte_values:
        combined |= value
    return combined % VECTOR_BYTES == 0


class Constexprs(dict):
    """A layout's constexprs and compile options (``kernel[grid](..., **constexprs)``), with
    ``layout``: the same as a tuple, hashable, computed once (``launch_config`` memoizes it), the
    part of a ``launcher.Launcher`` key that stands for Triton's constexprs and options."""

    __slots__ = ("layout",)

    def __init__(self, **values):
        super().__init__(**values)
        self.layout = tuple(values.items())


def planned(slot: list | None, plan, *args) -> tuple:
    """``plan(*args)``: a launch's ``launcher.Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``;
    ``()``: nothing to launch), computed once per layout. ``slot`` is ``mla_fuse.layouts``' slot
    for the arguments' layout (a one-element list, the same list for every call whose tensors have
    the same addresses, sizes, strides, dtypes and devices and whose other arguments are equal:
    everything a plan reads, and the addresses the launch it keeps passes), or None (no slot:
    computed every call). A slot is only ever given the arguments of its own layout."""
    if slot is None:
        return plan(*args)
    found = slot[0]
    if found is None:
        found = plan(*args)
        if found:
            found.kept = True  # the plan of one set of addresses: it may keep its launch (launcher.Plan)
        slot[0] = found
    return found


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


def scale_stride(scale: torch.Tensor) -> int:
    """Element stride between per-head scales: 0 for a one-element scale (every head shares it)."""
    return 0 if scale.numel() == 1 else scale.stride(0)
