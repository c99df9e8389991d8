"""Exact float conversions for the kernels, as ``@triton.jit`` helpers.

Every down-cast works on the IEEE bit pattern of an fp32 value, so the result
is the same bits on a GPU and under Triton's interpreter (whose own
fp32->bf16 cast truncates and whose fp8 casts are wrong,
triton-lang/triton#8322). ``tests/test_interpreter_conversions.py`` proves
them bitwise against the reference on a broad set of values.

* Normal results, round to nearest even (RNE) on the bits: to drop the low
  ``n`` bits of ``u``, add ``2^(n-1) - 1 + bit_n(u)`` and shift right by ``n``;
  a carry out of the mantissa bumps the exponent, which is the correct rounding.
* Subnormal results: ``RNE(|x| / spacing)`` is the low bits of the IEEE fp32
  sum ``|x| + MAGIC``, where ``ulp(MAGIC) = spacing`` (one correctly rounded
  addition; no multiply precedes it, so nothing can be contracted into an FMA).

Helpers:

* ``round_float32(x, DTYPE)``: fp32 -> bf16/fp16 RNE; overflow -> inf (as IEEE),
  NaN -> a quiet NaN with the sign kept. fp32 -> fp32 is the identity.
* ``widen_to_float32(x)``: bf16/fp16/fp32 -> fp32, exact (bf16 by a shift).
* ``quantize(x, scale, FP8_FORMAT)``: ``code = fp8(clamp(float32(x) / scale))``:
  an IEEE division (``div_rn``, never a multiplication by ``1/scale``), then
  E4M3 (bias 7, finite max 448) or E5M2 (bias 15, finite max 57344) RNE,
  magnitudes past the finite max (inf included) saturate to it (satfinite),
  NaN -> ``0x7F | sign of x`` (not of the quotient: a GPU's division returns
  its canonical NaN, whose sign bit is clear; seen on an H200).
"""

from __future__ import annotations

import triton

import triton.language as tl

from mla_fuse.kernels import jit
#: ``FP8_FORMAT`` constexpr values of the kernels.
FP8_NONE = 0
FP8_E4M3 = 1
FP8_E5M2 = 2
#: fp8 format name (``validation.fp8_format``) -> ``FP8_FORMAT`` constexpr.
FP8_FORMATS = {None: FP8_NONE, "e4m3": FP8_E4M3, "e5m2": FP8_E5M2}


@jit
def round_float32(x, DTYPE: tl.constexpr):
    """fp32 ``x`` rounded once (RNE) to ``DTYPE`` (bf16, fp16 or fp32), as ``DTYPE``."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        high = bits >> 16
        # bf16 keeps the top 16 bits of fp32: RNE drop of 16 bits (a carry into the exponent is the
        # correct rounding; past the finite max it gives inf, as IEEE). Only NaN bit patterns can
        # wrap around 2^32 here, and those are replaced below.
        rounded = tl.add(tl.add(bits, 0x7FFF, sanitize_overflow=False), high & 1, sanitize_overflow=False) >> 16
        rounded = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, high | 0x0040, rounded)  # NaN -> quiet NaN
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif DTYPE == tl.float16:
        bits = x.to(tl.uint32, bitcast=True)
        magnitude = bits & 0x7FFFFFFF
        # normal (|x| >= 2^-14): RNE drop of 13 bits, rebias the exponent 127 -> 15;
        # |x| >= 65520 rounds past the finite max 65504: clamp at inf (0x7C00)
        # (below 2^-14 the subtraction wraps around 2^32; those lanes take the subnormal result)
        half = tl.add(tl.add(magnitude, 0x0FFF, sanitize_overflow=False), (magnitude >> 13) & 1,
                      sanitize_overflow=False) >> 13
        half = tl.sub(half, 112 << 10, sanitize_overflow=False)
        half = tl.minimum(half, 0x7C00)
        # subnormal (|x| < 2^-14): RNE(|x| * 2^24), the low bits of the fp32 sum |x| + 0.5 (ulp 2^-24)
        small = tl.minimum(magnitude, 0x38800000).to(tl.float32, bitcast=True)
        subnormal = tl.sub((small + 0.5).to(tl.uint32, bitcast=True), 0x3F000000, sanitize_overflow=False)
        half = tl.where(magnitude < 0x38800000, subnormal, half)
        half = tl.where(magnitude > 0x7F800000, 0x7E00, half)  # NaN -> quiet NaN
        return (half | ((bits >> 16) & 0x8000)).to(tl.uint16).to(tl.float16, bitcast=True)
    else:
        return x


@jit
def widen_to_float32(x):
    """bf16/fp16/fp32 ``x`` as fp32, exactly (bf16: the bits shifted left by 16)."""
    if x.dtype == tl.bfloat16:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@jit
def quantize(x, scale, FP8_FORMAT: tl.constexpr):
    """``code = fp8(clamp(float32(x) / scale))``: uint8 E4M3 (``FP8_E4M3``) or E5M2 (``FP8_E5M2``) code.

    The division is IEEE round-to-nearest (``div_rn``), never a multiplication by ``1/scale``.
    """
    # E4M3FN: bias 7, 3 mantissa bits, finite max 448 = code 0x7E; E5M2: bias 15, 2 bits, 57344 = 0x7B
    MANTISSA_BITS: tl.constexpr = 3 if FP8_FORMAT == 1 else 2
    EXPONENT_BIAS: tl.constexpr = 7 if FP8_FORMAT == 1 else 15
    MAX_FINITE_CODE: tl.constexpr = 0x7E if FP8_FORMAT == 1 else 0x7B
    DROPPED: tl.constexpr = 23 - MANTISSA_BITS
    ROUND_BIAS: tl.constexpr = (1 << (DROPPED - 1)) - 1
    MIN_NORMAL_BITS: tl.constexpr = (128 - EXPONENT_BIAS) << 23  # 2^(1 - bias)
    # subnormal spacing 2^(1 - bias - mantissa bits) = ulp(MAGIC)
    MAGIC: tl.constexpr = 2.0 ** (24 - EXPONENT_BIAS - MANTISSA_BITS)
    MAGIC_BITS: tl.constexpr = (151 - EXPONENT_BIAS - MANTISSA_BITS) << 23

    # ---- float32(x) / scale, IEEE division
    wide = widen_to_float32(x)
    quotient = tl.math.div_rn(wide, scale)
    bits = quotient.to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # ---- normal: RNE drop of 23 - mantissa bits, rebias the exponent 127 -> bias;
    #      satfinite: every magnitude rounding past the finite max (inf included) -> the finite max
    #      (below the smallest normal the subtraction wraps around 2^32; those lanes take the subnormal result)
    code = tl.add(tl.add(magnitude, ROUND_BIAS, sanitize_overflow=False), (magnitude >> DROPPED) & 1,
                  sanitize_overflow=False) >> DROPPED
    code = tl.sub(code, (127 - EXPONENT_BIAS) << MANTISSA_BITS, sanitize_overflow=False)
    code = tl.minimum(code, MAX_FINITE_CODE)
    # ---- subnormal (|q| < 2^(1 - bias)): RNE(|q| / spacing), the low bits of the fp32 sum |q| + MAGIC
    small = tl.minimum(magnitude, MIN_NORMAL_BITS).to(tl.float32, bitcast=True)
    subnormal = tl.sub((small + MAGIC).to(tl.uint32, bitcast=True), MAGIC_BITS, sanitize_overflow=False)
    code = tl.where(magnitude < MIN_NORMAL_BITS, subnormal, code)
    # ---- NaN -> 0x7F | the sign of x (a GPU's division returns its canonical NaN, sign bit clear)
    nan = magnitude > 0x7F800000
    code = tl.where(nan, 0x7F, code)
    sign = tl.where(nan, wide.to(tl.uint32, bitcast=True), bits) >> 24 & 0x80
    return (code | sign).to(tl.uint8)
