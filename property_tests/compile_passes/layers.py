"""The layers of the compile-pass toy models: their ropes (the custom op, the native formula, the
DeepSeek YaRN native form, and an inverse rotation no pattern covers) and each layer kind
(``mla``/``mha``) in each *situation* a fusion pass must recognise:

============================  ====================================================================
``plain``                     the layer as a serving engine writes it: fusion must fire (if allowed)
``pre_rotation_reader``       k (MLA ``k_pe``) is also used as it was before the rope: must not fuse
``second_reader``             the projection buffer q/k view (MHA ``qkv``, MLA ``q``/latent) is read
                              again after the rope: must not fuse (a fused in-place write, or
                              rewiring its users, would change what that reader sees)
``unsupported_rope``          the inverse rotation (sin flipped), a rope form no pattern covers
``second_split_reader``       the projection buffer is split again after the rope, with other sizes
                              (MHA ``[q | k v]``, MLA ``[kv_c[:-1] | kv_c[-1] k_pe]``), and a rotated
                              column of that split is read: must not fuse (the scatter chain has a
                              reader besides its re-split)
``splits_along_two_dims``     the layer output, viewed as ``[T, n, n]``, is split with the same sizes
                              along dim 1 and along dim 2 (two splits that must stay two): must fuse
``scattered_copy_reader``     the rotated k (MLA ``k_pe``) is also copied into a slice of a buffer of
                              the layer's own (``packed[:, 1:] = k``, a ``slice_scatter`` into another
                              tensor, as vLLM's DeepSeek-V2 layer assembles its k), and another op
                              reads that buffer: must fuse, and the scatter must stay (it is no
                              write-back of k: dropping it leaves the reader the buffer's zeros)
============================  ====================================================================

``FUSING_SITUATIONS`` are those in which the fusion must fire (where allowed).
"""

from __future__ import annotations

import torch

from mla_fuse.layers import DeepseekScalingRotaryEmbedding, MHAAttention, MLAAttention, RotaryEmbedding

ROPE_FORMS = ("custom_op", "native", "deepseek_native")
SITUATIONS = ("plain", "pre_rotation_reader", "second_reader", "unsupported_rope", "second_split_reader",
              "splits_along_two_dims", "scattered_copy_reader")
FUSING_SITUATIONS = ("plain", "splits_along_two_dims", "scattered_copy_reader")
POSITIONS = 64          # rows of a plain table; a DeepSeek table has POSITIONS // 4 * 4
YARN_FACTOR = 4.0


# ------------------------------------------------------------------ ropes


def make_rope(form: str, is_neox: bool, head_size: int, rotary_dim: int, *,
              use_custom_op: bool | None = None) -> RotaryEmbedding:
    """``custom_op``/``native``: plain table; ``deepseek_native``: YaRN table. ``use_custom_op``
    overrides the form's default (the eager reference calls the custom op whatever the form)."""
    custom = form == "custom_op" if use_custom_op is None else use_custom_op
    if form == "deepseek_native":
        return DeepseekScalingRotaryEmbedding(head_size, rotary_dim, POSITIONS // 4, 10000.0, is_neox, YARN_FACTOR,
                                              mscale=0.707, mscale_all_dim=0.707, use_custom_op=custom)
    return RotaryEmbedding(head_size, rotary_dim, POSITIONS, 10000.0, is_neox, use_custom_op=custom)


def inverse_rope(positions, query, key, cos_sin_cache, head_size: int, rotary_dim: int, is_neox: bool):
    """Not a supported form: ``a' = a*cos + b*sin``, ``b' = b*cos - a*sin`` on GPT-J pairs (the inverse
    rotation), in torch ops; ``is_neox`` is ignored."""
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)

    def rotate(x):
        parts = x.view(x.size(0), -1, head_size)
        a, b = parts[..., 0:rotary_dim:2].float(), parts[..., 1:rotary_dim:2].float()
        c, s = cos[:, None, :], sin[:, None, :]
        rotated = torch.stack([a * c + b * s, b * c - a * s], dim=-1).flatten(-2).to(x.dtype)
        return torch.cat([rotated, parts[..., rotary_dim:]], dim=-1).view(x.shape)

    return rotate(query), None if key is None else rotate(key)


class InverseRope(RotaryEmbedding):
    """``inverse_rope`` as a module (there is no kernel for it: always torch ops)."""

    def __init__(self, head_size: int, rotary_dim: int, is_neox: bool) -> None:
        super().__init__(head_size, rotary_dim, POSITIONS, 10000.0, is_neox, use_custom_op=False)

    def forward(self, positions, query, key=None):
        return inverse_rope(positions, query, key, self.cos_sin_cache, self.head_size, self.rotary_dim,
                            self.is_neox_style)


# ------------------------------------------------------------------ layers in each situation


def _plus(out: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """``out + read`` in fp32, rounded once (a same-dtype add after ``o_proj`` becomes an ``addmm``)."""
    return (out.float() + read.float()).to(out.dtype)


class PreRotationReaderMLA(MLAAttention):
    """k_pe before the rope is used after it (``k_pe_out = rotated - 2 * original``)."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        q, latent, kv_c, k_pe = self._project(hidden_states)
        k_pe_before = k_pe * 2
        k_pe = self._rotate(positions, q, k_pe)
        return self.update_and_attend(q, self.kv_a_layernorm(kv_c), k_pe), q, k_pe - k_pe_before

    def _project(self, hidden_states):
        q = self.q_proj(hidden_states).view(-1, self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        latent = self.kv_a_proj_with_mqa(hidden_states)
        return (q, latent, *latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1))

    def _rotate(self, positions, q, k_pe):
        q_pe, k_pe = self.rotary_emb(positions, q[..., self.qk_nope_head_dim:], k_pe)
        if not self.rotary_emb.use_custom_op:
            q[..., self.qk_nope_head_dim:] = q_pe
        return k_pe


class SecondReaderMLA(PreRotationReaderMLA):
    """The latent projection ``[kv_c | k_pe]`` is read again after the rope: its last column (in
    ``k_pe``) joins the output."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        q, latent, kv_c, k_pe = self._project(hidden_states)
        k_pe = self._rotate(positions, q, k_pe)
        latent_read = latent[:, -1:]
        return _plus(self.update_and_attend(q, self.kv_a_layernorm(kv_c), k_pe), latent_read), q, k_pe


class PreRotationReaderMHA(MHAAttention):
    """k before the rope is used after it."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        qkv, (q, k, v) = self._project(hidden_states)
        k_before = k * 2
        q, k = self.rotary_emb(positions, q, k)
        return self.update_and_attend(q, k, v), q, k - k_before

    def _project(self, hidden_states):
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        qkv = self.qkv_proj(hidden_states)
        return qkv, qkv.split([q_size, kv_size, kv_size], dim=-1)


class SecondReaderMHA(PreRotationReaderMHA):
    """The packed ``qkv`` buffer is read again after the rope: its first column of k joins the output."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        qkv, (q, k, v) = self._project(hidden_states)
        q, k = self.rotary_emb(positions, q, k)
        q_size = self.num_heads * self.head_size
        qkv_read = qkv[:, q_size:q_size + 1]
        return _plus(self.update_and_attend(q, k, v), qkv_read), q, k


class SecondSplitReaderMLA(PreRotationReaderMLA):
    """After the rope the latent projection is split again as ``[kv_c[:-1] | kv_c[-1], k_pe]``; the last
    column of that second part (in the rotated ``k_pe``) joins the output."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        q, latent, kv_c, k_pe = self._project(hidden_states)
        k_pe = self._rotate(positions, q, k_pe)
        _, tail = latent.split([self.kv_lora_rank - 1, self.qk_rope_head_dim + 1], dim=-1)
        return _plus(self.update_and_attend(q, self.kv_a_layernorm(kv_c), k_pe), tail[:, -1:]), q, k_pe


class SecondSplitReaderMHA(PreRotationReaderMHA):
    """After the rope the packed ``qkv`` is split again as ``[q | k v]``; the first column of ``k`` joins
    the output."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        qkv, (q, k, v) = self._project(hidden_states)
        q, k = self.rotary_emb(positions, q, k)
        q_size = self.num_heads * self.head_size
        _, kv = qkv.split([q_size, qkv.size(-1) - q_size], dim=-1)
        return _plus(self.update_and_attend(q, k, v), kv[:, :1]), q, k


def _splits_along_two_dims(out: torch.Tensor) -> torch.Tensor:
    """``out`` plus, in its first ``n`` columns, the first row minus the first column of ``out[:, :n*n]``
    viewed as ``[T, n, n]``: one tensor split with sizes ``[1, n - 1]`` along dim 1 and along dim 2."""
    n = 4 if out.size(-1) >= 16 else 2
    square = out[:, :n * n].reshape(-1, n, n)
    row = square.split([1, n - 1], dim=1)[0].flatten(1)
    column = square.split([1, n - 1], dim=2)[0].flatten(1)
    return torch.cat([_plus(out[:, :n], row - column), out[:, n:]], dim=-1)


class SplitsAlongTwoDimsMLA(MLAAttention):
    """A plain MLA layer whose output goes through ``_splits_along_two_dims``."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        out, q, k_pe = super().forward_with_rope_outputs(positions, hidden_states)
        return _splits_along_two_dims(out), q, k_pe


class SplitsAlongTwoDimsMHA(MHAAttention):
    """A plain MHA layer whose output goes through ``_splits_along_two_dims``."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        out, q, k = super().forward_with_rope_outputs(positions, hidden_states)
        return _splits_along_two_dims(out), q, k


def _scattered_copy_read(out: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``out`` plus, in its first column, the last column of ``packed = [0 | k]``, a buffer the rotated
    ``k [T, W]`` is copied into (``packed[:, 1:] = k``: a ``slice_scatter`` into a tensor of its own)."""
    packed = k.new_zeros(k.size(0), k.size(-1) + 1)
    packed[:, 1:] = k
    return torch.cat([_plus(out[:, :1], packed[:, -1:]), out[:, 1:]], dim=-1)


class ScatteredCopyReaderMLA(MLAAttention):
    """A plain MLA layer whose rotated ``k_pe`` is also copied into a buffer another op reads."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        out, q, k_pe = super().forward_with_rope_outputs(positions, hidden_states)
        return _scattered_copy_read(out, k_pe), q, k_pe


class ScatteredCopyReaderMHA(MHAAttention):
    """A plain MHA layer whose rotated ``k`` is also copied into a buffer another op reads."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        out, q, k = super().forward_with_rope_outputs(positions, hidden_states)
        return _scattered_copy_read(out, k), q, k


LAYER_CLASSES = {
    ("mla", "plain"): MLAAttention, ("mla", "pre_rotation_reader"): PreRotationReaderMLA,
    ("mla", "second_reader"): SecondReaderMLA, ("mla", "unsupported_rope"): MLAAttention,
    ("mla", "second_split_reader"): SecondSplitReaderMLA, ("mla", "splits_along_two_dims"): SplitsAlongTwoDimsMLA,
    ("mha", "plain"): MHAAttention, ("mha", "pre_rotation_reader"): PreRotationReaderMHA,
    ("mha", "second_reader"): SecondReaderMHA, ("mha", "unsupported_rope"): MHAAttention,
    ("mha", "second_split_reader"): SecondSplitReaderMHA, ("mha", "splits_along_two_dims"): SplitsAlongTwoDimsMHA,
    ("mla", "scattered_copy_reader"): ScatteredCopyReaderMLA, ("mha", "scattered_copy_reader"): ScatteredCopyReaderMHA,
}

