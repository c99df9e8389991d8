"""RoPE of query and key heads, in place (``rotary_embedding``).

Formula, for every token ``t < T``, head ``h`` and pair ``j < R/2`` of the
head's first ``R`` elements (NeoX: ``(j, j + R/2)``, GPT-J: ``(2j, 2j + 1)``),
``c, s = cos_sin_cache[positions[t], j], cos_sin_cache[positions[t], R/2 + j]``:

    x[t, h, pair] <- round(a*c - b*s), round(b*c + a*s)      (fp32 math, one rounding)

for ``x`` = ``query`` and ``key`` (if given). Elements ``R..head_size`` of a
head are not touched (partial rotary).

Grid: ``(cdiv(T, BLOCK_TOKENS), G)`` with ``G = cdiv(H, query_heads_per_program)``.
Program ``(i, g)`` rotates tokens ``[i*BLOCK_TOKENS, +BLOCK_TOKENS)``, query
heads ``[g*query_heads_per_program, ...)`` and key heads
``[g*key_heads_per_program, ...)`` with ``key_heads_per_program = cdiv(Hkv, G)``.

Operands (element strides; the innermost stride is 1 everywhere):
  positions     [T]                                  int32/int64    stride_position
  query         [T, H, hs] or [T, H * hs]            fp32/fp16/bf16 stride_query_token, stride_query_head
  key           [T, Hkv, hs] or [T, Hkv * hs], opt.  query dtype    stride_key_token, stride_key_head
  cos_sin_cache [P, R]                               fp32/in dtype  stride_cos_sin_position

Compiled variants (docs/DESIGN.md): ``R/2`` is a runtime value masked inside the power-of-two tile
``BLOCK_HALF``; ``FULL_HALF`` says it fills the tile, and then the kernel uses the tile width itself
(no mask, no clamp: the code of a constexpr size). Every argument is out of Triton's specialisation
(``do_not_specialize`` and ``do_not_specialize_on_alignment``, all int64): no integer's value and no
single pointer's alignment makes a new kernel. What a GPU gains from alignment, 16-byte vector loads
and stores, needs every row aligned at once, so the launcher checks all of them (addresses, strides
and in-row offsets of ``query``, ``key`` and the table; NeoX's second halves at ``R/2``) and passes
one constexpr ``ALIGNED``; the kernel then marks its full tiles' pointers with ``tl.multiple_of``.
Compiled variants: dtypes, formats, flags and tiles only.
"""

from __future__ import annotations

import functools

import torch
import triton.language as tl

from mla_fuse.kernels import EVERY_ARGUMENT, config, jit
from mla_fuse.kernels.indexing import head_range, token_range
from mla_fuse.kernels.launcher import Launcher, Plan
from mla_fuse.kernels.rotation import load_cos_sin, rotate_in_place


@jit(do_not_specialize=EVERY_ARGUMENT, do_not_specialize_on_alignment=EVERY_ARGUMENT)
def rotary_embedding_kernel(
    # pointers
    positions_ptr, query_ptr, key_ptr, cos_sin_ptr,
    # sizes
    num_tokens: tl.int64, num_query_heads: tl.int64, num_key_heads: tl.int64, query_heads_per_program: tl.int64,
    key_heads_per_program: tl.int64, half: tl.int64,
    # strides
    stride_position: tl.int64, stride_query_token: tl.int64, stride_query_head: tl.int64,
    stride_key_token: tl.int64, stride_key_head: tl.int64, stride_cos_sin_position: tl.int64,
    # constexprs
    IS_NEOX: tl.constexpr, HAS_KEY: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_QUERY_HEADS: tl.constexpr,
    BLOCK_KEY_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr, FULL_HALF: tl.constexpr, ALIGNED: tl.constexpr,
):
    # ---- sizes: a full tile's width is the constexpr itself
    half_width = BLOCK_HALF if FULL_HALF else half

    # ---- program id -> tokens and heads
    tokens, token_mask = token_range(num_tokens, BLOCK_TOKENS)
    head_block = tl.program_id(1)

    # ---- load position -> cos/sin  [BLOCK_TOKENS, 1, BLOCK_HALF], fp32
    cos, sin = load_cos_sin(positions_ptr, cos_sin_ptr, tokens, token_mask, stride_position, stride_cos_sin_position,
                            half_width, BLOCK_HALF, FULL_HALF, ALIGNED)

    # ---- rotate query[tokens, heads, :R] in place
    heads, head_mask = head_range(head_block, query_heads_per_program, num_query_heads, BLOCK_QUERY_HEADS)
    rows = query_ptr + tokens[:, None] * stride_query_token + heads[None, :] * stride_query_head
    rotate_in_place(rows, token_mask[:, None] & head_mask[None, :], cos, sin, half_width, BLOCK_HALF, FULL_HALF,
                    IS_NEOX, ALIGNED)

    # ---- rotate key[tokens, heads, :R] in place
    if HAS_KEY:
        heads, head_mask = head_range(head_block, key_heads_per_program, num_key_heads, BLOCK_KEY_HEADS)
        rows = key_ptr + tokens[:, None] * stride_key_token + heads[None, :] * stride_key_head
        rotate_in_place(rows, token_mask[:, None] & head_mask[None, :], cos, sin, half_width, BLOCK_HALF, FULL_HALF,
                        IS_NEOX, ALIGNED)


def _token_and_head_strides(x: torch.Tensor, head_size: int) -> tuple[int, int, int]:
    """(heads, token stride, head stride) of a ``[T, heads, hs]`` or ``[T, heads * hs]`` tensor."""
    size, stride = x.shape, x.stride()
    if len(size) == 3:
        return size[1], stride[0], stride[1]
    return size[1] // head_size, stride[0], head_size


@functools.lru_cache(config.LAUNCH_CACHE_SIZE)
def launch_config(num_tokens: int, num_query_heads: int, num_key_heads: int, has_key: bool, rotary_dim: int,
                  is_neox: bool) -> tuple[tuple, int, int, dict]:
    """(grid, query and key heads per program, constexprs and options) of a layout; memoized (``config``)."""
    half = rotary_dim // 2
    query_heads_per_program = config.heads_per_program(num_query_heads, rotary_dim)
    num_head_blocks = max(config.cdiv(num_query_heads, query_heads_per_program), 1)  # key heads need a program
    key_heads_per_program = max(config.cdiv(num_key_heads, num_head_blocks), 1)
    block_query_heads = config.block(query_heads_per_program)
    block_key_heads = config.block(key_heads_per_program) if has_key else 1
    block_tokens = config.token_block(num_tokens, (block_query_heads + block_key_heads) * rotary_dim)
    block_half = config.block(half)
    grid = (config.cdiv(num_tokens, block_tokens), num_head_blocks)
    return grid, query_heads_per_program, key_heads_per_program, config.Constexprs(
        IS_NEOX=is_neox, HAS_KEY=has_key, BLOCK_TOKENS=block_tokens, BLOCK_QUERY_HEADS=block_query_heads,
        BLOCK_KEY_HEADS=block_key_heads, BLOCK_HALF=block_half, FULL_HALF=half == block_half,
        num_warps=config.num_warps(block_tokens * block_query_heads * 2 * block_half), **config.COMPILE_OPTIONS)


#: the kernel's launches, Triton's per-call binding done once per layout (launcher.py)
launcher = Launcher(rotary_embedding_kernel)


def launch(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None, head_size: int,
           cos_sin_cache: torch.Tensor, is_neox: bool, slot: list | None = None) -> None:
    """Launch on already validated arguments; strides come from the tensors as given. ``slot``:
    ``mla_fuse.layouts``' slot for these arguments' layout, where their launch plan is kept
    (``config.planned``)."""
    plan = config.planned(slot, _plan, positions, query, key, head_size, cos_sin_cache, is_neox)
    if plan:
        launcher(plan, positions, query, query if key is None else key, cos_sin_cache)


def _plan(positions, query, key, head_size, cos_sin_cache, is_neox) -> Plan | tuple:
    """The launch's ``Plan`` (grid, sizes and strides, constexprs, ``ALIGNED``); () when there is nothing to launch."""
    num_tokens = query.size(0)
    rotary_dim = cos_sin_cache.size(1)
    if num_tokens == 0:
        return ()
    num_query_heads, stride_query_token, stride_query_head = _token_and_head_strides(query, head_size)
    if key is None:
        num_key_heads, stride_key_token, stride_key_head = 0, 0, 0
    else:
        num_key_heads, stride_key_token, stride_key_head = _token_and_head_strides(key, head_size)
    grid, query_heads_per_program, key_heads_per_program, constexprs = launch_config(
        num_tokens, num_query_heads, num_key_heads, key is not None, rotary_dim, bool(is_neox))
    half = rotary_dim // 2
    neox_half = half if is_neox else 0  # NeoX rows also move their second half as vectors
    stride_table = cos_sin_cache.stride(0)
    aligned = config.aligned(
        query.data_ptr(), 0 if key is None else key.data_ptr(), cos_sin_cache.data_ptr(),
        query.element_size() * (stride_query_token | stride_query_head | stride_key_token | stride_key_head
                                | neox_half),
        cos_sin_cache.element_size() * (stride_table | half))
    return Plan(grid, (
        num_tokens, num_query_heads, num_key_heads, query_heads_per_program, key_heads_per_program, half,
        positions.stride(0), stride_query_token, stride_query_head, stride_key_token, stride_key_head, stride_table,
    ), constexprs, aligned)
