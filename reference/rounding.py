"""Round float64 values once, to nearest even, onto a binary floating-point grid.

A format with ``mantissa_bits`` stored bits and smallest normal exponent
``min_exponent`` has, around ``x`` with ``2^e <= |x| < 2^(e+1)``, the spacing
``quantum = 2^(max(e, min_exponent) - mantissa_bits)``. Rounding once is
``round_half_even(x / quantum) * quantum``; both the division and the product
are exact in float64 (scaling by a power of two), so the only rounding is the
one asked for.

torch's own float64 -> bfloat16/float16 casts go through float32 on the CPU
(two roundings), which is why the reference does not use them. Powers of two are
built from their bits (``power_of_two``), not with ``torch.ldexp``: that is
``x * pow(2, e)``, and ``pow`` on a CUDA device is not exact (on an H200 the
reference then put fp8 codes one below the correct rounding).
"""

from __future__ import annotations

import torch

# dtype -> (stored mantissa bits, smallest normal exponent, largest finite value)
FLOAT_FORMATS = {
    torch.float32: (23, -126, torch.finfo(torch.float32).max),
    torch.float16: (10, -14, torch.finfo(torch.float16).max),
    torch.bfloat16: (7, -126, torch.finfo(torch.bfloat16).max),
}


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """``2^exponent`` in float64, exactly, for integer ``exponent`` in [-1022, 1023] (normal float64
    powers of two: the biased exponent ``exponent + 1023`` in bits 52-62, a zero fraction)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def round_to_grid(x: torch.Tensor, mantissa_bits: int, min_exponent: int) -> torch.Tensor:
    """Round float64 ``x`` to nearest, ties to even, on the grid described above (no range limit)."""
    assert x.dtype == torch.float64
    exponent = torch.frexp(x).exponent - 1  # |x| = m * 2^exponent with 1 <= m < 2
    exponent = torch.clamp(exponent, min=min_exponent)  # subnormals share the smallest normal's spacing
    quantum = power_of_two(exponent - mantissa_bits)
    return torch.round(x / quantum) * quantum  # torch.round rounds half to even


def round_once(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round float64 ``x`` once to ``dtype`` (IEEE round to nearest even; overflow becomes inf)."""
    if dtype == torch.float64:
        return x.clone()
    mantissa_bits, min_exponent, largest = FLOAT_FORMATS[dtype]
    rounded = round_to_grid(x, mantissa_bits, min_exponent)
    rounded = torch.where(rounded.abs() > largest, torch.copysign(torch.full_like(x, float("inf")), x), rounded)
    return rounded.to(dtype)  # exact: every value is representable now
