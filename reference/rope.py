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


def plain_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    """``inv_freq[i] = base^(-2i/R)``, ``i < R/2``."""
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return base ** (-2.0 * i / rotary_dim)


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
                  beta_fast: float = 32, beta_slow: float = 1, extrapolation_factor: float = 1) -> torch.Tensor:
    """DeepSeek YaRN: blend extrapolated and interpolated frequencies with a linear ramp."""
    low, high = yarn_correction_range(rotary_dim, base, original_max_position, beta_fast, beta_slow)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    ramp = torch.clamp((i - low) / (high - low), 0, 1)
    mask = (1 - ramp) * extrapolation_factor
    extrapolated = plain_inv_freq(rotary_dim, base)
    interpolated = extrapolated / factor
    return extrapolated * mask + interpolated * (1 - mask)


# ---------------------------------------------------------------- tables


def cos_sin_table(inv_freq: torch.Tensor, num_positions: int, magnitude: float = 1.0) -> torch.Tensor:
    """float64 ``[P, R]``: ``magnitude * [cos(p * inv_freq) | sin(p * inv_freq)]``."""
    angles = torch.outer(torch.arange(num_positions, dtype=torch.float64), inv_freq.to(torch.float64))
    return torch.cat([angles.cos(), angles.sin()], dim=-1) * magnitude


def plain_cos_sin_cache(rotary_dim: int, max_position: int, base: float = 10000.0,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The plain table, rounded once to ``dtype``."""
    return round_once(cos_sin_table(plain_inv_freq(rotary_dim, base), max_position), dtype)


def deepseek_yarn_cos_sin_cache(rotary_dim: int, original_max_position: int, base: float, factor: float,
                                beta_fast: float = 32, beta_slow: float = 1, extrapolation_factor: float = 1,
                                attn_factor: float = 1, mscale: float = 1, mscale_all_dim: float = 0,
                                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The DeepSeek YaRN table (``M * f`` rows), rounded once to ``dtype``."""
    inv_freq = yarn_inv_freq(rotary_dim, base, factor, original_max_position, beta_fast, beta_slow,
                             extrapolation_factor)
    magnitude = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) * attn_factor
    table = cos_sin_table(inv_freq, int(original_max_position * factor), magnitude)
    return round_once(table, dtype)


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
