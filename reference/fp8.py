"""fp8 E4M3 (FN) and E5M2 on codes: CONTRACT §3.

Quantize: ``code = rne_satfinite(float32(x) / scale)``: divide in float32,
round to nearest even, clamp magnitudes beyond the finite max to the finite
max (infinities too), keep NaN. Dequantize: ``float(code) * scale``.

Codes are ``torch.uint8`` bit patterns ``sign | exponent | mantissa``. NaN is
encoded as ``0x7F | sign``: E4M3FN's only NaN, and an E5M2 NaN.
"""

from __future__ import annotations

import dataclasses

import torch

from .rounding import power_of_two, round_to_grid


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_finite: float

    @property
    def min_exponent(self) -> int:
        """Exponent of the smallest normal value (subnormals share its spacing)."""
        return 1 - self.bias


FORMATS = {
    "e4m3": Fp8Format(exponent_bits=4, mantissa_bits=3, bias=7, max_finite=448.0),
    "e5m2": Fp8Format(exponent_bits=5, mantissa_bits=2, bias=15, max_finite=57344.0),
}
NAN_CODE = 0x7F
SIGN_BIT = 0x80


def encode(values: torch.Tensor, fmt: str) -> torch.Tensor:
    """Codes of float64 ``values``, rounded to nearest even, saturated, NaN kept."""
    f = FORMATS[fmt]
    values = values.to(torch.float64)
    sign = torch.signbit(values).to(torch.int64) * SIGN_BIT
    magnitude = round_to_grid(values.abs(), f.mantissa_bits, f.min_exponent)
    magnitude = torch.clamp(magnitude, max=f.max_finite)  # satfinite: never inf, never NaN
    normal = magnitude >= 2.0 ** f.min_exponent
    exponent = torch.where(normal, torch.frexp(magnitude).exponent - 1, f.min_exponent).to(torch.int64)
    significand = magnitude / power_of_two(exponent)
    fraction = torch.where(normal, significand - 1, significand)  # 1.m for normals, 0.m for subnormals
    mantissa = (fraction * 2 ** f.mantissa_bits).to(torch.int64)  # exact: a whole number after rounding
    biased_exponent = torch.where(normal, exponent + f.bias, 0)
    code = sign | (biased_exponent << f.mantissa_bits) | mantissa
    code = torch.where(torch.isnan(values), sign | NAN_CODE, code)
    return code.to(torch.uint8)


def decode(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    """float64 values of ``codes`` (uint8 or a float8 dtype viewed as uint8)."""
    f = FORMATS[fmt]
    bits = codes.view(torch.uint8).to(torch.int64)
    negative = (bits & SIGN_BIT) != 0
    biased_exponent = (bits >> f.mantissa_bits) & ((1 << f.exponent_bits) - 1)
    mantissa = (bits & ((1 << f.mantissa_bits) - 1)).to(torch.float64)
    fraction = mantissa / 2 ** f.mantissa_bits
    normal = biased_exponent > 0
    exponent = torch.where(normal, biased_exponent - f.bias, f.min_exponent).to(torch.float64)
    magnitude = torch.where(normal, 1 + fraction, fraction) * power_of_two(exponent)
    top_exponent = biased_exponent == (1 << f.exponent_bits) - 1
    if fmt == "e4m3":  # FN: no infinities; only S.1111.111 is NaN
        nan = top_exponent & (mantissa == 2 ** f.mantissa_bits - 1)
    else:  # IEEE-like: top exponent is inf (mantissa 0) or NaN
        magnitude = torch.where(top_exponent & (mantissa == 0), float("inf"), magnitude)
        nan = top_exponent & (mantissa != 0)
    magnitude = torch.where(nan, float("nan"), magnitude)
    return torch.where(negative, -magnitude, magnitude)


def quantize(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """``rne_satfinite(float32(x) / scale)``; ``scale`` broadcasts against ``x``."""
    quotient = x.to(torch.float32) / scale.to(torch.float32)  # one IEEE float32 division
    return encode(quotient.to(torch.float64), fmt)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """``float(code) * scale`` in float64."""
    return decode(codes, fmt) * scale.to(torch.float64)
