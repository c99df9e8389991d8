"""The fp8 stage of the eager mutant implementation: ``code = rne_satfinite(float32(x) / scale)``
and the fp8 bugs (switched on by ``self.bug``)."""

from __future__ import annotations

import torch

from mla_fuse import validation
from mla_fuse_conformance.declarations.dtypes import FP8_FORMATS

BULK_TOKENS = 512  # fp8_scale_dropped_past_512_tokens: launches past a decode batch take a second path

FP8 = {  # format -> (torch float8 dtype, finite max, overflow code of a non-saturating cast)
    "e4m3": (torch.float8_e4m3fn, FP8_FORMATS["e4m3"], 0x7F),
    "e5m2": (torch.float8_e5m2, FP8_FORMATS["e5m2"], 0x7C),
}


class Fp8Stage:
    """Quantization of what a cache stores, with the fp8 bugs."""

    bug = "none"

    def _quantize(self, x: torch.Tensor, scale: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
        """uint8 codes: ``code = rne_satfinite(float32(x) / scale)``."""
        fmt = validation.fp8_format(kv_cache_dtype)
        float8, max_finite, overflow_code = FP8[fmt]
        x = x.float()
        scale = scale.float()
        if self.bug == "fp8_per_head_scale_read_as_one":
            scale = scale.reshape(-1)[:1].reshape([1] * scale.dim())
        if self.bug == "fp8_scale_dropped":
            quotient = x
        elif self.bug == "fp8_scale_multiplied":
            quotient = x * scale
        else:
            quotient = x / scale
        if self.bug == "fp8_double_rounding":
            quotient = quotient.to(torch.bfloat16).float()
        if self.bug == "fp8_nan_to_zero":
            quotient = torch.nan_to_num(quotient, nan=0.0)
        saturated = quotient.clamp(-max_finite, max_finite)  # satfinite; NaN stays NaN
        codes = saturated.to(float8).view(torch.uint8)
        if self.bug == "fp8_overflow_not_saturated":
            sign = torch.signbit(quotient).to(torch.uint8) << 7
            codes = torch.where(quotient.abs() > max_finite, overflow_code | sign, codes)
        if self.bug == "fp8_ties_away_from_zero":
            codes = _ties_away_from_zero(quotient, codes, float8)
        return codes

    def _stored(self, x: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor) -> torch.Tensor:
        """What the cache stores for ``x``: fp8 codes, or the source bits."""
        if validation.fp8_format(kv_cache_dtype) is None:
            return x
        if self.bug == "fp8_scale_dropped_past_512_tokens" and x.size(0) > BULK_TOKENS:
            scale = torch.ones_like(scale)
        return self._quantize(x, scale, kv_cache_dtype)

    def _k_for_cache(self, original, rotated, positions, cos_sin_cache, is_neox, kv_cache_dtype, scale):
        """The k a fused op caches: the rotated k written back (or, under the bug, rope of its fp8 image)."""
        fmt = validation.fp8_format(kv_cache_dtype)
        if self.bug != "rope_after_quantization" or fmt is None or original.size(0) == 0:
            return rotated
        float8 = FP8[fmt][0]
        per_head = scale.float().reshape(1, -1, 1)
        dequantized = (self._quantize(original, per_head, kv_cache_dtype).view(float8).float() * per_head)
        dequantized = dequantized.to(original.dtype)
        rows = torch.ones(original.size(0), dtype=torch.bool)
        self._rope(positions, dequantized, cos_sin_cache, is_neox, rows, dequantized)
        return dequantized


def _ties_away_from_zero(quotient: torch.Tensor, codes: torch.Tensor, float8: torch.dtype) -> torch.Tensor:
    """Where RNE broke an exact tie toward zero, take the code away from zero instead."""
    magnitude = codes & 0x7F
    below = codes.view(float8).float().abs().double()
    above = ((codes & 0x80) | (magnitude + 1)).view(float8).float().abs().double()
    tie = quotient.abs().double() == (below + above) / 2
    return torch.where(tie & (magnitude < 0x7E), codes + 1, codes)

