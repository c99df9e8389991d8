"""Rotary position embedding, written like CONTRACT §1, in float64.

Table ``cos_sin_cache[P, R]``: row ``p`` holds ``R/2`` cosines then ``R/2``
sines of the angles ``p * inv_freq[i]``.

Pairs: NeoX ``(x[j], x[j + R/2])``; GPT-J ``(x[2j], x[2j + 1])``. Each pair
``(a, b)`` becomes ``(a*c - b*s, b*c + a*s)`` with ``c = cos[j]``, ``s = sin[j]``;
only the first ``R`` elements of a head rotate.
"""

from __future__ import annotations

import math

import torch

from .rounding import round_once

# ---------------------------------------------------------------- frequencies
# The expressions follow the order vLLM and transformers evaluate them in (docs/INPUTS.md
# "Tables"), in float64 by default (CONTRACT §1). With ``dtype=torch.float32`` the same
# expressions give the engines' fp32 tables bit for bit (tests/test_rope_tables_transformers.py).


def base_powers(rotary_dim: int, base: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``base^(2i/R)``, ``i < R/2``."""
    return base ** (torch.arange(0, rotary_dim, 2, dtype=dtype) / rotary_dim)


def plain_inv_freq(rotary_dim: int, base: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``inv_freq[i] = 1 / base^(2i/R)``, ``i < R/2``."""
    return 1.0 / base_powers(rotary_dim, base, dtype)


def yarn_correction_dim(num_rotations: float, rotary_dim: int, base: float, original_max_position: int) -> float:
    """``corr(n) = R * ln(M / (2*pi*n)) / (2 * ln(base))``."""
    return rotary_dim * math.log(original_max_position / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_correction_range(rotary_dim: int, base: float, original_max_position: int,
                          beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """``low = max(floor(corr(beta_fast)), 0)``, ``high = min(ceil(corr(beta_slow)), R - 1)``."""
    low = max(math.floor(yarn_correction_dim(beta_fast, rotary_dim, base, original_max_position)), 0)
    high = min(math.ceil(yarn_correction_dim(beta_slow, rotary_dim, base, original_max_position)), rotary_dim - 1)
    return low, high


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """``mscale(f, m) = 1 if f <= 1 else 0.1 * m * ln(f) + 1``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(rotary_dim: int, base: float, factor: float, original_max_position: int,
                  beta_fast: float = 32, beta_slow: float = 1, extrapolation_factor: float = 1,
                  dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """DeepSeek YaRN: ``interpolated * (1 - mask) + extrapolated * mask`` with
    ``extrapolated = 1 / base^(2i/R)``, ``interpolated = 1 / (factor * base^(2i/R))``,
    ``mask = (1 - ramp) * extrapolation_factor``, ``ramp = clamp((i - low) / (high - low), 0, 1)``."""
    low, high = yarn_correction_range(rotary_dim, base, original_max_position, beta_fast, beta_slow)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
    mask = (1 - ramp) * extrapolation_factor
    powers = base_powers(rotary_dim, base, dtype)
    extrapolated = 1.0 / powers
    interpolated = 1.0 / (factor * powers)
    return interpolated * (1 - mask) + extrapolated * mask


# ---------------------------------------------------------------- tables


def cos_sin_table(inv_freq: torch.Tensor, num_positions: int, magnitude: float = 1.0) -> torch.Tensor:
    """``[P, R]`` in ``inv_freq``'s dtype: ``cos(p * inv_freq) * magnitude | sin(p * inv_freq) * magnitude``."""
    angles = torch.outer(torch.arange(num_positions, dtype=inv_freq.dtype), inv_freq)
    return torch.cat([angles.cos() * magnitude, angles.sin() * magnitude], dim=-1)


def plain_cos_sin_cache(rotary_dim: int, max_position: int, base: float = 10000.0,
                        dtype: torch.dtype = torch.float32, compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The plain table, computed in ``compute_dtype`` and rounded once to ``dtype``."""
    return _rounded(cos_sin_table(plain_inv_freq(rotary_dim, base, compute_dtype), max_position), dtype)


def deepseek_yarn_cos_sin_cache(rotary_dim: int, original_max_position: int, base: float, factor: float,
                                beta_fast: float = 32, beta_slow: float = 1, extrapolation_factor: float = 1,
                                attn_factor: float = 1, mscale: float = 1, mscale_all_dim: float = 0,
                                dtype: torch.dtype = torch.float32,
                                compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The DeepSeek YaRN table (``M * f`` rows), computed in ``compute_dtype`` and rounded once to ``dtype``."""
    inv_freq = yarn_inv_freq(rotary_dim, base, factor, original_max_position, beta_fast, beta_slow,
                             extrapolation_factor, compute_dtype)
    magnitude = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) * attn_factor
    return _rounded(cos_sin_table(inv_freq, int(original_max_position * factor), magnitude), dtype)


def _rounded(table: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``table`` rounded once to ``dtype`` (nothing to do when it already is)."""
    return table if table.dtype == dtype else round_once(table.to(torch.float64), dtype)


# ---------------------------------------------------------------- rotation


def pair_indices(rotary_dim: int, is_neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Element indices of the first and second member of each of the ``R/2`` pairs."""
    j = torch.arange(rotary_dim // 2)
    if is_neox:
        return j, j + rotary_dim // 2
    return 2 * j, 2 * j + 1


def rope_exact(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor,
               is_neox: bool) -> torch.Tensor:
    """float64 rotation of ``x[T, heads, D]``; elements past ``R`` pass through."""
    rotary_dim = cos_sin_cache.size(1)
    half = rotary_dim // 2
    rows = cos_sin_cache.to(torch.float64)[positions.long()]  # [T, R]
    cos = rows[:, None, :half]  # same rotation for every head of a token
    sin = rows[:, None, half:]
    first, second = pair_indices(rotary_dim, is_neox)
    x64 = x.to(torch.float64)
    a, b = x64[..., first], x64[..., second]
    out = x64.clone()
    out[..., first] = a * cos - b * sin
    out[..., second] = b * cos + a * sin
    return out


def rope(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """``rope_exact`` rounded once to ``x.dtype``; the tail past ``R`` is the input, bit for bit."""
    rotary_dim = cos_sin_cache.size(1)
    out = x.clone()  # the tail keeps its bits (NaN payloads included): it is never converted
    out[..., :rotary_dim] = round_once(rope_exact(positions, x[..., :rotary_dim], cos_sin_cache, is_neox), x.dtype)
    return out
