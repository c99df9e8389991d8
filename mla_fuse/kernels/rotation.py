"""RoPE building blocks shared by the kernels, as ``@triton.jit`` helpers.

Table ``cos_sin_cache[P, R]`` (inner stride 1): row ``p`` holds ``R/2``
cosines then ``R/2`` sines. Pairs of a head's rotary part (its first ``R``
elements), ``j < R/2``:

* NeoX (``IS_NEOX``): ``(x[j], x[j + R/2])``;
* GPT-J: ``(x[2j], x[2j + 1])``.

``half`` (``R/2``) is a runtime value, or the constexpr ``BLOCK_HALF`` itself when
``FULL_HALF`` (the kernels pass ``BLOCK_HALF if FULL_HALF else half``): a full tile has no
element mask and no clamp, so its code is what a constexpr width gives. A partial tile masks
``j < half`` and clamps.

A tile of rows ``[BLOCK_TOKENS, BLOCK_HEADS]`` (pointers to element 0 of each
row's rotary part) becomes one pair tile ``[BLOCK_TOKENS, BLOCK_HEADS,
BLOCK_HALF, 2]`` (member last), so widening, rotating, rounding and
quantizing run once per tile. GPT-J rows are loaded flat (``2 * BLOCK_HALF``
contiguous elements) and reshaped, NeoX rows through ``[BLOCK_HALF, 2]``
offsets ``j + k * R/2``: both keep 16-byte vector loads and stores on GPU
(checked in the PTX by ``tests/test_aot_compile.py``) where the rows are 16-byte aligned, and
where the launcher found every row 16-byte aligned (``ALIGNED``: it then marks the full tiles'
pointers with ``tl.multiple_of``, since the kernels leave pointer alignment and strides out of
Triton's specialisation).

Rotation, in fp32 and rounded once (RNE) to the row's dtype:
``a' = a*c - b*s``, ``b' = b*c + a*s`` with ``c = cos[j]``, ``s = sin[j]``.

Masked-off lanes keep in-bounds addresses (the element index is clamped).
"""

from __future__ import annotations

import triton

import triton.language as tl

from mla_fuse.kernels import jit
from mla_fuse.kernels.conversions import round_float32, widen_to_float32


@jit
def pair_pointers(rows, row_mask, half, BLOCK_HALF: tl.constexpr, FULL_HALF: tl.constexpr, IS_NEOX: tl.constexpr,
                  ALIGNED: tl.constexpr):
    """Pointers and mask of the pair elements of ``rows [BT, BH]``.

    NeoX: ``[BT, BH, BLOCK_HALF, 2]``; GPT-J: flat ``[BT, BH, 2 * BLOCK_HALF]``. ``ALIGNED`` (every
    row and NeoX second half starts on a 16-byte boundary): a full tile's runs are marked so.
    """
    if IS_NEOX:
        j = tl.arange(0, BLOCK_HALF).to(tl.int64)[:, None]
        member = tl.arange(0, 2).to(tl.int64)[None, :]
        mask = row_mask[:, :, None, None] & (j < half)
        if not FULL_HALF:  # clamp masked-off lanes in bounds (full blocks keep their contiguity)
            j = tl.minimum(j, half - 1)
        ptrs = rows[:, :, None, None] + (j + member * half)
        if ALIGNED and FULL_HALF:
            ptrs = tl.multiple_of(ptrs, [1, 1, 16, 1])
        return ptrs, mask
    else:
        r = tl.arange(0, 2 * BLOCK_HALF).to(tl.int64)
        mask = row_mask[:, :, None] & (r < 2 * half)
        if not FULL_HALF:
            r = tl.minimum(r, 2 * half - 1)
        ptrs = rows[:, :, None] + r
        if ALIGNED and FULL_HALF:
            ptrs = tl.multiple_of(ptrs, [1, 1, 16])
        return ptrs, mask


@jit
def store_pairs(rows, row_mask, pairs, half, BLOCK_HALF: tl.constexpr, FULL_HALF: tl.constexpr,
                IS_NEOX: tl.constexpr, ALIGNED: tl.constexpr):
    """Store ``[BT, BH, BLOCK_HALF, 2]`` pairs into the rotary part of ``rows [BT, BH]``."""
    ptrs, mask = pair_pointers(rows, row_mask, half, BLOCK_HALF, FULL_HALF, IS_NEOX, ALIGNED)
    if not IS_NEOX:
        pairs = tl.reshape(pairs, [pairs.shape[0], pairs.shape[1], 2 * BLOCK_HALF])
    tl.store(ptrs, pairs, mask=mask)


@jit
def load_cos_sin(positions_ptr, cos_sin_ptr, tokens, token_mask, stride_position, stride_cos_sin_position, half,
                 BLOCK_HALF: tl.constexpr, FULL_HALF: tl.constexpr, ALIGNED: tl.constexpr):
    """fp32 ``cos, sin [BLOCK_TOKENS, 1, BLOCK_HALF]``: the halves of row ``positions[t]`` of the table."""
    positions = tl.load(positions_ptr + tokens * stride_position, mask=token_mask, other=0).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF).to(tl.int64)[:, None]
    which = tl.arange(0, 2).to(tl.int64)[None, :]  # 0: cos, 1: sin
    mask = token_mask[:, None, None] & (j < half)
    if not FULL_HALF:
        j = tl.minimum(j, half - 1)
    rows = cos_sin_ptr + positions * stride_cos_sin_position
    ptrs = rows[:, None, None] + (j + which * half)
    if ALIGNED and FULL_HALF:  # the cosines and the sines start on 16-byte boundaries
        ptrs = tl.multiple_of(ptrs, [1, 16, 1])
    cos_sin = tl.load(ptrs, mask=mask, other=0.0)  # (cos[j], sin[j])
    cos, sin = tl.split(widen_to_float32(cos_sin))
    return cos[:, None, :], sin[:, None, :]


@jit
def rotate_in_place(rows, row_mask, cos, sin, half, BLOCK_HALF: tl.constexpr, FULL_HALF: tl.constexpr,
                    IS_NEOX: tl.constexpr, ALIGNED: tl.constexpr):
    """Rotate the rotary part of ``rows [BT, BH]`` in place.

    Returns the rotated pairs ``[BT, BH, BLOCK_HALF, 2]`` in the rows' dtype (the bits written back).
    """
    # ---- load the pairs
    ptrs, mask = pair_pointers(rows, row_mask, half, BLOCK_HALF, FULL_HALF, IS_NEOX, ALIGNED)
    pairs = tl.load(ptrs, mask=mask)
    if not IS_NEOX:
        pairs = tl.reshape(pairs, [pairs.shape[0], pairs.shape[1], BLOCK_HALF, 2])
    a, b = tl.split(widen_to_float32(pairs))
    # ---- rotate in fp32: a' = a*c - b*s ; b' = b*c + a*s
    rotated = tl.join(a * cos - b * sin, b * cos + a * sin)
    # ---- one marked cast down: fp32 -> the rows' dtype, round to nearest even
    rotated = round_float32(rotated, rows.dtype.element_ty)
    # ---- store in place
    if IS_NEOX:
        tl.store(ptrs, rotated, mask=mask)
    else:
        tl.store(ptrs, tl.reshape(rotated, [rotated.shape[0], rotated.shape[1], 2 * BLOCK_HALF]), mask=mask)
    return rotated
