"""Deliberately buggy implementations, for the verification suite's self-test.

``EagerImplementation`` is a small, plain eager-torch implementation of the five
operations of CONTRACT §4 (fp32 math rounded once, explicit saturation before the fp8
cast, cache writes by explicit address arithmetic on the cache's storage, like a
kernel). Each mutant switches on exactly one bug from ``shared/BUGS.md``; ``MUTANTS``
maps a name to its class, and ``mla_fuse_conformance.contract.implementation`` registers each as
``mutant:<name>``. ``mutant:none`` is the bug-free base: it must pass the whole suite,
which shows every other mutant is caught for its bug and not for a broken base. The
other ``HONEST`` variants declare and honour the other ``padded_rows`` and ``rounding``
values (vLLM- and FlashInfer-like behaviour); they must pass too.

``tests/test_mutants.py`` asserts that the properties catch every mutant within the
``ci`` profile. ``BUG_CLASSES`` says which BUGS.md class each mutant stands for;
``APPROXIMATED`` names the ones that model a kernel-only bug in eager code.

This module is part of ``mla_fuse`` and imports neither ``reference`` nor the suites.
"""

from __future__ import annotations

import torch

from mla_fuse import validation
from mla_fuse_conformance.contract.operations import OPERATION_ARGUMENTS

FP8 = {  # format -> (torch float8 dtype, finite max, overflow code of a non-saturating cast)
    "e4m3": (torch.float8_e4m3fn, 448.0, 0x7F),
    "e5m2": (torch.float8_e5m2, 57344.0, 0x7C),
}

# name -> (BUGS.md section, what the mutant does)
BUG_CLASSES: dict[str, tuple[str, str]] = {
    "none": ("-", "the bug-free base; must pass every property"),
    # honest variants: other declarations, kept; they must pass too (the suite honours declarations)
    "none_padded_q_only": ("-", "declares padded_rows='q_only' and leaves k of padded rows unrotated (vLLM)"),
    "none_padded_skipped": ("-", "declares padded_rows='skipped' and leaves padded rows alone (FlashInfer)"),
    "none_per_op_rounding": ("-", "declares rounding='per_op' and rounds after every operation (vLLM CUDA)"),
    # RoPE geometry
    "style_swapped": ("RoPE geometry", "NeoX and GPT-J pairing swapped"),
    "neox_hardcoded": ("RoPE geometry", "NeoX pairing whatever is_neox says"),
    "pairs_permuted_in_output": ("RoPE geometry", "rotated pairs stored in NeoX order for GPT-J (q_pe and k_pe alike)"),
    "rotary_width_from_head_size": ("RoPE geometry", "pair offset and pair count taken from the head size"),
    "rotate_tail_instead_of_head": ("RoPE geometry", "partial rotary applied to the last R elements of a head"),
    "cos_sin_swapped": ("RoPE geometry", "cos and sin halves of the table swapped"),
    "sin_sign_flipped": ("RoPE geometry", "inverse rotation (sign of sin flipped)"),
    "table_low_precision": ("RoPE geometry", "cos/sin rounded to bfloat16 before use"),
    "per_op_rounding_declared_single": ("RoPE geometry", "rounds after every operation but declares 'single'"),
    "one_head_path": ("RoPE geometry", "a one-head query takes a special path with the wrong pairing"),
    "odd_token_tail": ("RoPE geometry", "the last token of an odd token count is not processed"),
    "block_tail_dropped": ("RoPE geometry", "tokens past the last full block of 16 are not processed"),
    "decode_rows_misindexed": ("RoPE geometry", "every row reads the position of row 0"),
    # Positions and indices
    "positions_read_as_int32": ("Positions and indices", "int64 positions read through an int32 pointer"),
    "positions_flattened": ("Positions and indices", "positions of another shape silently flattened"),
    "position_past_table_read": ("Positions and indices",
                                 "no position value check: a position past the table reads the last row"),
    "address_wraps_at_2_16": ("Positions and indices",
                              "cache addresses wrap (int32 overflow, modelled at 2^16 elements)"),
    # Padding and slots
    "padded_slot_written_to_last": ("Padding and slots", "slot -1 not skipped: written at block -1, offset B - 1"),
    "short_slot_mapping_rows_not_rotated": ("Padding and slots", "rows past len(slot_mapping) not rotated"),
    "reads_slot_mapping_past_end": ("Padding and slots", "T slots read from a shorter slot_mapping's storage"),
    "padded_tokens_write_reserved_slot": ("Padding and slots", "padded tokens write NaN into reserved slot 0"),
    "padded_rows_skipped": ("Padding and slots", "padded q/k rows left unrotated though 'rotated' is declared"),
    # Cache layout
    "block_size_hardcoded_16": ("Cache layout", "block and offset computed with block size 16"),
    "cache_assumed_contiguous": ("Cache layout", "cache strides assumed contiguous"),
    "mla_regions_swapped": ("Cache layout", "MLA entry written as [k_pe | kv_c]"),
    "rest_of_block_zeroed": ("Cache layout", "the other entries of each touched block zeroed"),
    # fp8
    "fp8_scale_dropped": ("fp8", "scale treated as 1"),
    "fp8_scale_multiplied": ("fp8", "multiplied by the scale instead of divided"),
    "fp8_value_scale_ignored": ("fp8", "scale applied to K only"),
    "fp8_kv_scales_swapped": ("fp8", "K and V scales swapped"),
    "fp8_per_head_scale_read_as_one": ("fp8", "per-head scale read as one value"),
    "fp8_overflow_not_saturated": ("fp8", "overflow becomes NaN (E4M3) or inf (E5M2)"),
    "fp8_double_rounding": ("fp8", "quotient rounded to bfloat16, then to fp8"),
    "fp8_ties_away_from_zero": ("fp8", "ties rounded away from zero instead of to even"),
    "fp8_nan_to_zero": ("fp8", "NaN encoded as zero"),
    "rope_after_quantization": ("fp8", "rope applied to already quantized k"),
    # Strides and aliasing
    "token_stride_ignored": ("Strides and aliasing", "token stride of q/k/kv_c assumed packed"),
    "one_head_stride_for_q_and_k": ("Strides and aliasing", "one head stride (the smaller) used for q and k"),
    "writes_to_copy": ("Strides and aliasing", "rope writes land in a contiguous copy"),
    "storage_offset_dropped": ("Strides and aliasing", "views addressed from storage offset 0"),
    # Bad input (CONTRACT §4)
    "validates_after_writing": ("Padding and slots", "argument checks run after the writes"),
    "rotary_width_larger_than_head_accepted": ("RoPE geometry", "a table wider than the head accepted"),
}

#: Mutants that model a bug of a compiled kernel in eager code (see the module docstring of the suite).
APPROXIMATED = {
    "address_wraps_at_2_16": "int32 address overflow needs > 2^31 elements; the wrap is modelled at 2^16",
    "reads_slot_mapping_past_end": "an out-of-bounds masked load, modelled as reading the storage past the view",
    "positions_read_as_int32": "a pointer reinterpretation, modelled on a contiguous copy of the positions",
}

#: Variants without a bug (other declarations, honoured): the suite must pass them.
HONEST = {"none", "none_padded_q_only", "none_padded_skipped", "none_per_op_rounding"}
DECLARATIONS = {"none_padded_q_only": {"padded_rows": "q_only"}, "none_padded_skipped": {"padded_rows": "skipped"},
                "none_per_op_rounding": {"rounding": "per_op"}}

UNPROCESSED_BLOCK = 16


class EagerImplementation:
    """The five operations in eager PyTorch, bug-free unless ``bug`` names one (``BUG_CLASSES``)."""

    name = "mutant:none"
    bug = "none"
    rounding = "single"
    padded_rows = "rotated"
    checks_inputs = True
    shared_head_stride = None  # set per call for the one_head_stride_for_q_and_k bug

    # ------------------------------------------------------------ the operations

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        positions = self._accepted_positions(positions)

        def work():
            tokens = self._processed_tokens(query.size(0))
            heads = self._heads(query, head_size)
            self._share_head_stride(heads, None if key is None else self._heads(key, head_size))
            self._rope(positions, heads, cos_sin_cache, is_neox, tokens, heads)
            if key is not None:
                self._rope(positions, self._heads(key, head_size), cos_sin_cache, is_neox, tokens, heads)
        self._checked_run("rotary_embedding", work, positions, query, key, head_size, cos_sin_cache, is_neox)

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        def work():
            self._mla_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
        self._checked_run("concat_and_cache_mla", work, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)

    def concat_and_cache_mla_rope_fused(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                        kv_cache, kv_cache_dtype, kv_cache_scale):
        positions = self._accepted_positions(positions)

        def work():
            original_k = k_pe.clone()
            self._rope(positions, q_pe, cos_sin_cache, is_neox, self._rotated_rows("q", slot_mapping, q_pe), q_pe)
            self._rope(positions, k_pe[:, None, :], cos_sin_cache, is_neox, self._rotated_rows("k", slot_mapping, q_pe),
                       q_pe)
            cached_k = self._k_for_cache(original_k[:, None, :], k_pe[:, None, :], positions, cos_sin_cache,
                                         is_neox, kv_cache_dtype, kv_cache_scale)[:, 0, :]
            self._mla_write(kv_c, cached_k, kv_cache, slot_mapping, kv_cache_dtype, kv_cache_scale)
        self._checked_run("concat_and_cache_mla_rope_fused", work, positions, q_pe, k_pe, kv_c, cos_sin_cache,
                          is_neox, slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale)

    def reshape_and_cache_flash(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                v_scale):
        def work():
            self._flash_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
        self._checked_run("reshape_and_cache_flash", work, key, value, key_cache, value_cache, slot_mapping,
                          kv_cache_dtype, k_scale, v_scale)

    def rope_and_reshape_and_cache_flash(self, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                         cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale):
        positions = self._accepted_positions(positions)

        def work():
            self._share_head_stride(query, key)
            original_key = key.clone()
            self._rope(positions, query, cos_sin_cache, is_neox, self._rotated_rows("q", slot_mapping, query), query)
            self._rope(positions, key, cos_sin_cache, is_neox, self._rotated_rows("k", slot_mapping, query), query)
            cached_key = self._k_for_cache(original_key, key, positions, cos_sin_cache, is_neox, kv_cache_dtype,
                                           k_scale)
            self._flash_write(cached_key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                              v_scale)
        self._checked_run("rope_and_reshape_and_cache_flash", work, positions, query, key, value, key_cache,
                          value_cache, slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale)

    # ------------------------------------------------------------ argument checks

    def _accepted_positions(self, positions):
        if self.bug == "positions_flattened" and isinstance(positions, torch.Tensor):
            return positions.flatten()
        return positions

    def _checked_run(self, operation: str, work, *args) -> None:
        """Validate (CONTRACT §4: before any write), then work."""
        self.shared_head_stride = None
        check = getattr(validation, f"check_{operation}")
        if self.bug == "validates_after_writing":
            work()
        check_values = False if self.bug == "position_past_table_read" else None
        try:
            check(*args, check_values=check_values)
        except ValueError as error:
            if not (self.bug == "rotary_width_larger_than_head_accepted" and "larger than the head" in str(error)):
                raise
        if self.bug == "position_past_table_read" and validation.values_checked(None):
            self._check_slot_values(operation, args)
        if self.bug != "validates_after_writing":
            work()

    def _check_slot_values(self, operation, args) -> None:
        names = OPERATION_ARGUMENTS[operation]
        if "slot_mapping" in names:
            cache = args[names.index("kv_cache" if "kv_cache" in names else "key_cache")]
            validation.check_index_values(operation, slot_mapping=args[names.index("slot_mapping")],
                                          num_slots=cache.size(0) * cache.size(1))

    # ------------------------------------------------------------ rope

    def _heads(self, x: torch.Tensor, head_size: int) -> torch.Tensor:
        return x if x.dim() == 3 else x.view(x.size(0), x.size(1) // head_size, head_size)

    def _processed_tokens(self, tokens: int) -> torch.Tensor:
        """Rows an operation processes at all (shape-specific path bugs drop some)."""
        rows = torch.ones(tokens, dtype=torch.bool)
        if self.bug == "odd_token_tail" and tokens % 2 == 1:
            rows[-1] = False
        if self.bug == "block_tail_dropped" and tokens > UNPROCESSED_BLOCK and tokens % UNPROCESSED_BLOCK:
            rows[tokens - tokens % UNPROCESSED_BLOCK:] = False
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
        new_a, new_b = torch.where(keep, x[..., first], new_a), torch.where(keep, x[..., second], new_b)
        if self.bug == "pairs_permuted_in_output" and not is_neox:
            pairs = torch.arange(rotary_dim // 2, device=x.device)
            first, second = pairs, pairs + rotary_dim // 2
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

    # ------------------------------------------------------------ fp8

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

    # ------------------------------------------------------------ paged cache writes

    def _mla_write(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> None:
        if self.bug == "token_stride_ignored":
            kv_c = torch.as_strided(kv_c, kv_c.shape, (kv_c.size(1), 1), kv_c.storage_offset())
        latent = self._stored(kv_c, kv_cache_dtype, scale)
        rope = self._stored(k_pe, kv_cache_dtype, scale)
        parts = (rope, latent) if self.bug == "mla_regions_swapped" else (latent, rope)
        entries = torch.cat(parts, dim=-1)  # [T, L + R]
        self._write_entries(kv_cache, entries[:, None, :], slot_mapping)

    def _flash_write(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        if self.bug == "fp8_kv_scales_swapped":
            k_scale, v_scale = v_scale, k_scale
        if self.bug == "fp8_value_scale_ignored":
            v_scale = torch.ones_like(v_scale)
        key = self._stored(key, kv_cache_dtype, k_scale.reshape(1, -1, 1))
        value = self._stored(value, kv_cache_dtype, v_scale.reshape(1, -1, 1))
        self._write_entries(key_cache, key, slot_mapping)
        self._write_entries(value_cache, value, slot_mapping)

    def _slots(self, slot_mapping: torch.Tensor, tokens: int) -> torch.Tensor:
        if self.bug == "reads_slot_mapping_past_end" and slot_mapping.numel() < tokens:
            available = slot_mapping.untyped_storage().nbytes() // slot_mapping.element_size()
            stride = max(slot_mapping.stride(0), 1)
            count = min(tokens, (available - slot_mapping.storage_offset() - 1) // stride + 1)
            slot_mapping = torch.as_strided(slot_mapping, (count,), (stride,), slot_mapping.storage_offset())
        return slot_mapping.long()

    def _write_entries(self, cache: torch.Tensor, entries: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write ``entries [T, heads, width]`` at their slots by explicit address arithmetic on the
        cache's storage, honouring its block, entry, head and element strides."""
        tokens = entries.size(0)
        processed = self._processed_tokens(tokens).to(cache.device)
        slots = self._slots(slot_mapping, tokens).to(cache.device)
        if cache.element_size() == 1:
            cache, entries = cache.view(torch.uint8), entries.view(torch.uint8) if entries.dtype != torch.uint8 \
                else entries
        storage = torch.as_strided(cache, (cache.untyped_storage().nbytes() // cache.element_size(),), (1,), 0)
        token = torch.arange(slots.numel(), device=cache.device)
        valid = (slots >= 0) & processed[: slots.numel()]
        if self.bug == "padded_slot_written_to_last":
            valid = processed[: slots.numel()].clone()
        if self.bug == "padded_tokens_write_reserved_slot":
            padded = token[slots < 0]
            reserved = torch.zeros_like(padded)
            self._store(storage, cache, reserved, _nan_like(entries[padded]))
        if self.bug == "rest_of_block_zeroed":
            blocks = (slots[valid] // cache.size(1)).unique()
            for offset in range(cache.size(1)):
                zeros = torch.zeros_like(entries[: blocks.numel()])
                self._store(storage, cache, blocks * cache.size(1) + offset, zeros)
        self._store(storage, cache, slots[valid], entries[token[valid]])

    def _store(self, storage, cache, slots, entries) -> None:
        block_size = cache.size(1)
        strides = list(cache.stride())
        if self.bug == "cache_assumed_contiguous":
            strides = list(torch.empty(cache.shape, device="meta").stride())
        if self.bug == "block_size_hardcoded_16":
            block = (slots // UNPROCESSED_BLOCK) % cache.size(0)
            offset = (slots % UNPROCESSED_BLOCK) % block_size
        else:
            block, offset = slots // block_size, slots % block_size  # slot -1: block -1, offset B - 1
        base = cache.storage_offset() + block * strides[0] + offset * strides[1]
        inner = _inner_offsets(cache.shape[2:], strides[2:], cache.device)
        address = base[:, None] + inner[None, :]
        if self.bug == "address_wraps_at_2_16":
            address = address % 2 ** 16
        storage[address.reshape(-1)] = entries.reshape(-1).to(storage.dtype)


def _inner_offsets(shape, strides, device) -> torch.Tensor:
    """Storage offsets of every element of one cache entry (``[width]`` or ``[heads, width]``), flattened."""
    offsets = torch.zeros(1, dtype=torch.long, device=device)
    for size, stride in zip(shape, strides):
        offsets = (offsets[:, None] + torch.arange(size, device=device)[None, :] * stride).reshape(-1)
    return offsets


def _nan_like(entries: torch.Tensor) -> torch.Tensor:
    if entries.dtype == torch.uint8:
        return torch.full_like(entries, 0x7F)
    return torch.full_like(entries, float("nan"))


def _ties_away_from_zero(quotient: torch.Tensor, codes: torch.Tensor, float8: torch.dtype) -> torch.Tensor:
    """Where RNE broke an exact tie toward zero, take the code away from zero instead."""
    magnitude = codes & 0x7F
    below = codes.view(float8).float().abs().double()
    above = ((codes & 0x80) | (magnitude + 1)).view(float8).float().abs().double()
    tie = quotient.abs().double() == (below + above) / 2
    return torch.where(tie & (magnitude < 0x7E), codes + 1, codes)


def _mutant_class(bug: str) -> type:
    class_name = "Mutant_" + bug
    doc = f"Mutant '{bug}' ({BUG_CLASSES[bug][0]}): {BUG_CLASSES[bug][1]}."
    attributes = {"bug": "none" if bug in HONEST else bug, "name": f"mutant:{bug}", "__doc__": doc,
                  "__module__": __name__, **DECLARATIONS.get(bug, {})}
    return type(class_name, (EagerImplementation,), attributes)


MUTANTS: dict[str, type] = {bug: _mutant_class(bug) for bug in BUG_CLASSES}
globals().update({cls.__name__: cls for cls in MUTANTS.values()})
