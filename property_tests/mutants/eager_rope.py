"""The rope stage of the eager mutant implementation: rows, positions, pairs, rotation, and the
stride and aliasing bugs of how a kernel addresses q and k (switched on by ``self.bug``)."""

from __future__ import annotations

import torch

from mla_fuse_conformance.declarations.presets import SERVING

UNPROCESSED_BLOCK = 16
HEAD_TILE = 64  # heads_tile_64_without_loop
PAIR_TILE = 32  # rotary_tile_32_pairs_without_loop
HEADS_X_PAIRS_TILE = 2048  # heads_x_pairs_tile_2048_without_loop


class RopeStage:
    """Rotation of q/k rows in place, with the RoPE-geometry, position and stride bugs."""

    bug = "none"
    rounding = "single"
    padded_rows = "rotated"
    shared_head_stride = None  # set per call for the one_head_stride_for_q_and_k bug

    def _heads(self, x: torch.Tensor, head_size: int) -> torch.Tensor:
        return x if x.dim() == 3 else x.view(x.size(0), x.size(1) // head_size, head_size)

    def _processed_tokens(self, tokens: int) -> torch.Tensor:
        """Rows an operation processes at all (shape-specific path bugs drop some)."""
        rows = torch.ones(tokens, dtype=torch.bool)
        if self.bug == "odd_token_tail" and tokens % 2 == 1:
            rows[-1] = False
        if self.bug == "block_tail_dropped" and tokens > UNPROCESSED_BLOCK and tokens % UNPROCESSED_BLOCK:
            rows[tokens - tokens % UNPROCESSED_BLOCK:] = False
        if self.bug == "token_grid_capped_at_65535":
            rows[SERVING.grid_rows:] = False
        return rows

    def _rotated_rows(self, tensor: str, slot_mapping: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Rows of q (``tensor == "q"``) or k a fused op rotates: all, unless ``padded_rows`` says otherwise."""
        tokens = query.size(0)
        rows = self._processed_tokens(tokens)
        written = torch.zeros(tokens, dtype=torch.bool)
        written[: slot_mapping.numel()] = slot_mapping.cpu() >= 0
        skipped = self.padded_rows == "skipped" or (self.padded_rows == "q_only" and tensor == "k")
        if self.bug == "padded_rows_skipped" or skipped:
            rows &= written
        if self.bug == "short_slot_mapping_rows_not_rotated":
            rows[slot_mapping.numel():] = False
        return rows

    def _positions(self, positions: torch.Tensor) -> torch.Tensor:
        tokens = positions.numel()
        if self.bug == "positions_read_as_int32" and positions.dtype == torch.int64:
            return positions.contiguous().view(torch.int32)[:tokens].long()
        positions = positions.long()
        if self.bug == "positions_narrowed_to_16_bits":
            positions = positions % 2 ** 16
        if self.bug == "decode_rows_misindexed" and tokens:
            return positions[:1].expand(tokens)
        return positions

    def _pairs(self, rotary_dim: int, head_size: int, is_neox: bool, num_heads: int):
        """Element indices of the first and second member of each pair, and the cos/sin column of each."""
        if self.bug == "style_swapped" or (self.bug == "one_head_path" and num_heads == 1):
            is_neox = not is_neox
        if self.bug == "neox_hardcoded":
            is_neox = True
        half = rotary_dim // 2
        pairs = torch.arange(half)
        column = pairs
        if self.bug == "rotary_width_from_head_size" and rotary_dim < head_size:
            pairs = torch.arange(head_size // 2)
            column = pairs % half
            half = head_size // 2
        first, second = (pairs, pairs + half) if is_neox else (2 * pairs, 2 * pairs + 1)
        if self.bug == "rotate_tail_instead_of_head":
            first, second = first + head_size - rotary_dim, second + head_size - rotary_dim
        if self.bug == "rotary_width_larger_than_head_accepted":
            first, second = first % head_size, second % head_size
        if self.bug == "rotary_tile_32_pairs_without_loop":
            first, second, column = first[:PAIR_TILE], second[:PAIR_TILE], column[:PAIR_TILE]
        return first, second, column

    def _rope(self, positions, x: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool, rows: torch.Tensor,
              query: torch.Tensor) -> None:
        """Rotate the first R elements of each head of ``x [T, heads, D]`` in place, for ``rows``
        (``query``: the ``[T, H, D]`` query of the same call, for the shape-path and stride bugs)."""
        tokens, num_heads, head_size = x.shape
        if tokens == 0:
            return
        x = self._addressed(x, query)
        rotary_dim = cos_sin_cache.size(1)
        position = self._positions(positions)
        if self.bug == "position_past_table_read":
            position = position.clamp(0, cos_sin_cache.size(0) - 1)
        table = cos_sin_cache.float()[position.to(cos_sin_cache.device)]  # [T, R]
        if self.bug == "table_low_precision":
            table = table.to(torch.bfloat16).float()
        cos, sin = table[:, : rotary_dim // 2], table[:, rotary_dim // 2:]
        if self.bug == "cos_sin_swapped":
            cos, sin = sin, cos
        if self.bug == "sin_sign_flipped":
            sin = -sin
        first, second, column = self._pairs(rotary_dim, head_size, is_neox, query.size(1))
        first, second = first.to(x.device), second.to(x.device)
        cos, sin = cos[:, None, column.to(x.device)], sin[:, None, column.to(x.device)]
        # a' = a*c - b*s, b' = b*c + a*s in fp32, rounded once to the dtype
        a, b = x[..., first].float(), x[..., second].float()
        if self.rounding == "per_op" or self.bug == "per_op_rounding_declared_single":
            def rounded(value):  # round to the dtype after every operation, as vLLM's CUDA kernel does
                return value.to(x.dtype).float()
            new_a = rounded(rounded(a * cos) - rounded(b * sin)).to(x.dtype)
            new_b = rounded(rounded(b * cos) + rounded(a * sin)).to(x.dtype)
        else:
            new_a, new_b = (a * cos - b * sin).to(x.dtype), (b * cos + a * sin).to(x.dtype)
        keep = ~rows.to(x.device)[:, None, None]
        if self.bug == "heads_tile_64_without_loop":
            keep = keep | (torch.arange(num_heads, device=x.device) >= HEAD_TILE)[None, :, None]
        if self.bug == "heads_x_pairs_tile_2048_without_loop":  # (head, pair) flattened into one tile
            flat = torch.arange(num_heads, device=x.device)[:, None] * first.numel() + torch.arange(first.numel(),
                                                                                                   device=x.device)
            keep = keep | (flat >= HEADS_X_PAIRS_TILE)[None]
        new_a, new_b = torch.where(keep, x[..., first], new_a), torch.where(keep, x[..., second], new_b)
        if self.bug == "pairs_permuted_in_output" and not is_neox:
            pairs = torch.arange(rotary_dim // 2, device=x.device)
            first, second = pairs, pairs + rotary_dim // 2
        if self.bug == "misaligned_vector_store" and is_neox:
            new_a = _stored_as_if_aligned(x, 0, new_a)
            new_b = _stored_as_if_aligned(x, rotary_dim // 2, new_b)
        x[..., first] = new_a
        x[..., second] = new_b

    def _share_head_stride(self, query: torch.Tensor, key: torch.Tensor | None) -> None:
        """The one head stride the one_head_stride_for_q_and_k bug uses for q and k."""
        both = key is not None and query.size(1) > 1 and key.size(1) > 1
        self.shared_head_stride = min(query.stride(1), key.stride(1)) if both else None

    def _addressed(self, x: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The tensor the kernel actually reads and writes, under the stride and aliasing bugs."""
        tokens, num_heads, head_size = x.shape
        if self.bug == "writes_to_copy":
            return x.contiguous()
        if self.bug == "storage_offset_dropped":
            return torch.as_strided(x, x.shape, x.stride(), 0)
        if self.bug == "token_stride_ignored":
            return torch.as_strided(x, x.shape, (num_heads * x.stride(1), x.stride(1), 1), x.storage_offset())
        if self.bug == "one_head_stride_for_q_and_k" and self.shared_head_stride and num_heads > 1:
            # the smaller of the two head strides for both: it stays inside both allocations
            return torch.as_strided(x, x.shape, (x.stride(0), self.shared_head_stride, 1), x.storage_offset())
        return x


VECTOR_BYTES = 16  # misaligned_vector_store: 8 bf16 values per aligned store (vLLM CPU's vmovdqa)


def _stored_as_if_aligned(x: torch.Tensor, start: int, half: torch.Tensor) -> torch.Tensor:
    """``half [T, heads, R/2]`` (the new values of the elements at ``start`` of each head of ``x``) as
    an aligned 16-byte vector store leaves them: where the half's address is ``m`` elements past a
    16-byte boundary (bf16, R/2 >= 8), every value lands ``m`` elements early, the first ``m`` wrapping
    to the half's end; elsewhere unchanged."""
    width = half.size(-1)
    if x.dtype != torch.bfloat16 or width < VECTOR_BYTES // 2:
        return half
    tokens, heads = torch.arange(x.size(0))[:, None], torch.arange(x.size(1))[None, :]
    address = x.data_ptr() + (tokens * x.stride(0) + heads * x.stride(1) + start) * x.element_size()
    misaligned = (address % VECTOR_BYTES) // x.element_size()  # [T, heads], in elements
    columns = (torch.arange(width)[None, None, :] + misaligned[..., None]) % width
    return half.gather(-1, columns.to(half.device))
