"""Rotary embeddings: the cos/sin tables (CONTRACT §1) and two forwards each.

``cos_sin_cache [P, R]`` (fp32): row ``p`` holds ``R/2`` cosines then ``R/2`` sines of
``p * inv_freq[i]``. Pairs: NeoX ``(x[j], x[j + R/2])``, GPT-J ``(x[2j], x[2j+1])``;
``a' = a*cos - b*sin``, ``b' = b*cos + a*sin``; only the first ``R`` of each head rotate.

* ``forward_custom_op``: ``torch.ops.mla_fuse.rotary_embedding`` (in place; returns its inputs).
* ``forward_native``: the formula in torch ops (new tensors), so Inductor sees aten ops and the
  fusion pass can match it. Math in fp32, one cast down, like the kernels.

``RotaryEmbedding`` (plain table) writes the formula as ``x1*cos - x2*sin | x2*cos + x1*sin``;
``DeepseekScalingRotaryEmbedding`` (YaRN table) writes it as DeepSeek/vLLM do,
``x*cos' + rotate(x)*sin'`` with cos/sin expanded to the pair layout. The two native forms
are different graphs; the MLA fusion pass matches both.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import mla_fuse.ops  # noqa: F401  (registers torch.ops.mla_fuse.rotary_embedding)


def _base_powers(base: float, rotary_dim: int) -> torch.Tensor:
    """``base^(2i/R)`` in fp32, ``i < R/2`` (``pos_freqs`` in vLLM and transformers)."""
    return base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)


def _plain_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    """``inv_freq[i] = 1 / base^(2i/R)`` in fp32, in the engines' order (docs/INPUTS.md "Tables")."""
    return 1.0 / _base_powers(base, rotary_dim)


def _cos_sin_table(inv_freq: torch.Tensor, num_positions: float, magnitude: float = 1.0) -> torch.Tensor:
    """``[P, R]`` fp32: ``cos(p * inv_freq) * magnitude | sin(p * inv_freq) * magnitude``,
    ``P = ceil(num_positions)`` (``torch.arange`` of the row count, as vLLM builds it)."""
    angles = torch.outer(torch.arange(num_positions, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos() * magnitude, angles.sin() * magnitude], dim=-1)


def yarn_correction_dim(num_rotations: float, rotary_dim: int, base: float, max_position: int) -> float:
    """``corr(n) = R * ln(M / (2 pi n)) / (2 ln(base))``."""
    return rotary_dim * math.log(max_position / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_correction_range(beta_fast: float, beta_slow: float, rotary_dim: int, base: float,
                          max_position: int) -> tuple[float, float]:
    """``(low, high)``: ``max(floor(corr(beta_fast)), 0)``, ``min(ceil(corr(beta_slow)), R-1)``."""
    low = math.floor(yarn_correction_dim(beta_fast, rotary_dim, base, max_position))
    high = math.ceil(yarn_correction_dim(beta_slow, rotary_dim, base, max_position))
    return max(low, 0), min(high, rotary_dim - 1)


def yarn_linear_ramp(low: float, high: float, size: int) -> torch.Tensor:
    """``clamp((i - low) / (high - low), 0, 1)``; ``high += 0.001`` when equal."""
    if low == high:
        high += 0.001
    return ((torch.arange(size, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """``1`` if ``factor <= 1`` else ``0.1 * mscale * ln(factor) + 1``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class RotaryEmbedding(nn.Module):
    """Plain RoPE: ``inv_freq[i] = base^(-2i/R)``, ``max_position_embeddings`` table rows."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, *, use_custom_op: bool = True) -> None:
        super().__init__()
        if rotary_dim % 2 or rotary_dim > head_size:
            raise ValueError(f"rotary_dim must be even and <= head_size ({head_size}), got {rotary_dim}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.use_custom_op = use_custom_op
        self.register_buffer("cos_sin_cache", self._compute_cos_sin_cache(), persistent=False)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        return _cos_sin_table(_plain_inv_freq(self.base, self.rotary_dim), self.max_position_embeddings)

    def forward(self, positions: torch.Tensor, query: torch.Tensor,
                key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.use_custom_op:
            return self.forward_custom_op(positions, query, key)
        return self.forward_native(positions, query, key)

    def forward_custom_op(self, positions: torch.Tensor, query: torch.Tensor,
                          key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotate ``query`` and ``key`` in place with the Triton kernel; returns them."""
        torch.ops.mla_fuse.rotary_embedding(
            positions, query, key, self.head_size, self.cos_sin_cache, self.is_neox_style
        )
        return query, key

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rotated copies of ``query`` and ``key`` (``[T, heads, hs]`` or ``[T, heads*hs]``)."""
        return rope_native(positions, query, key, self.cos_sin_cache, self.head_size, self.rotary_dim,
                           self.is_neox_style)


class DeepseekScalingRotaryEmbedding(RotaryEmbedding):
    """DeepSeek YaRN RoPE (CONTRACT §1): ``original_max_position * scaling_factor`` table rows,
    blended frequencies and ``mscale(f, mscale) / mscale(f, mscale_all_dim) * attn_factor``
    applied to cos and sin."""

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, scaling_factor: float, *, extrapolation_factor: float = 1.0,
                 attn_factor: float = 1.0, beta_fast: float = 32, beta_slow: float = 1,
                 mscale: float = 1.0, mscale_all_dim: float = 0.0, use_custom_op: bool = True) -> None:
        self.scaling_factor = scaling_factor
        self.extrapolation_factor = extrapolation_factor
        self.attn_factor = attn_factor
        self.beta_fast = beta_fast
        self.beta_slow = beta_slow
        self.mscale = yarn_mscale(scaling_factor, mscale) / yarn_mscale(scaling_factor, mscale_all_dim) * attn_factor
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                         use_custom_op=use_custom_op)

    def _compute_inv_freq(self) -> torch.Tensor:
        """``inv_freq = interpolated * (1 - mask) + extrapolated * mask`` in fp32, with
        ``extrapolated = 1 / base^(2i/R)``, ``interpolated = 1 / (factor * base^(2i/R))`` and
        ``mask = (1 - ramp) * extrapolation_factor``: vLLM's and transformers' order, so the
        table is theirs bit for bit (docs/INPUTS.md "Tables")."""
        powers = _base_powers(self.base, self.rotary_dim)
        extrapolated = 1.0 / powers
        interpolated = 1.0 / (self.scaling_factor * powers)
        low, high = yarn_correction_range(self.beta_fast, self.beta_slow, self.rotary_dim, self.base,
                                          self.max_position_embeddings)
        mask = (1 - yarn_linear_ramp(low, high, self.rotary_dim // 2)) * self.extrapolation_factor
        return interpolated * (1 - mask) + extrapolated * mask

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """``M * f`` rows (rounded up, as vLLM's ``torch.arange`` does), scaled by ``mscale``."""
        return _cos_sin_table(self._compute_inv_freq(), self.max_position_embeddings * self.scaling_factor,
                              self.mscale)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor,
                       key: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """DeepSeek's form: ``x*cos' + rotate(x)*sin'``, cos/sin repeated to the pair layout."""
        return deepseek_rope_native(positions, query, key, self.cos_sin_cache, self.head_size, self.rotary_dim,
                                    self.is_neox_style)


# ------------------------------------------------------------ native formulas
# Module-level so the fusion patterns trace exactly the code the layers run.


def rope_native(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                cos_sin_cache: torch.Tensor, head_size: int, rotary_dim: int,
                is_neox: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain form: ``a' = a*cos - b*sin``, ``b' = b*cos + a*sin`` over the style's pairs."""
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)

    def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
        if is_neox:
            a, b = x.chunk(2, dim=-1)
        else:
            a, b = x[..., 0::2], x[..., 1::2]
        a_rot = a * cos[:, None, :] - b * sin[:, None, :]
        b_rot = b * cos[:, None, :] + a * sin[:, None, :]
        if is_neox:
            return torch.cat([a_rot, b_rot], dim=-1)
        return torch.stack([a_rot, b_rot], dim=-1).flatten(-2)

    query = _rotate_heads(query, rotate_pairs, head_size, rotary_dim)
    return query, None if key is None else _rotate_heads(key, rotate_pairs, head_size, rotary_dim)


def deepseek_rope_native(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                         cos_sin_cache: torch.Tensor, head_size: int, rotary_dim: int,
                         is_neox: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """DeepSeek's form: ``x*cos' + rotate(x)*sin'`` with cos/sin repeated to the pair layout
    (NeoX: ``rotate(x) = [-x2 | x1]``; GPT-J: ``rotate(x)[2j:2j+2] = (-x[2j+1], x[2j])``)."""
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    if is_neox:
        cos, sin = cos.repeat(1, 2), sin.repeat(1, 2)
    else:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)

    def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
        if is_neox:
            rotated = torch.cat([-x[..., rotary_dim // 2:], x[..., : rotary_dim // 2]], dim=-1)
        else:
            rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    query = _rotate_heads(query, rotate_pairs, head_size, rotary_dim)
    return query, None if key is None else _rotate_heads(key, rotate_pairs, head_size, rotary_dim)


def _rotate_heads(x: torch.Tensor, rotate_pairs, head_size: int, rotary_dim: int) -> torch.Tensor:
    """Apply ``rotate_pairs`` (fp32) to the first ``rotary_dim`` of each head; one cast back to x's dtype."""
    heads = x.view(x.size(0), -1, head_size)
    rotated = rotate_pairs(heads[..., :rotary_dim].float()).to(x.dtype)
    if rotary_dim < head_size:
        rotated = torch.cat([rotated, heads[..., rotary_dim:]], dim=-1)
    return rotated.view(x.shape)
