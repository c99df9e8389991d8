"""Which bug each mutant stands for, and the honest variants (data only).

``BUG_CLASSES`` maps a mutant's name to its section of ``docs/BUGS.md`` and what it does;
``HONEST`` are the variants without a bug (other declarations, honoured: they must pass);
``DECLARATIONS`` are those declarations; ``APPROXIMATED`` names the mutants that model a
compiled kernel's bug in eager code. ``mutants.kernels`` turns each name into a class.
"""

from __future__ import annotations

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
    # Real-model sizes (a tile or grid that covers the sizes a quick test draws, not the models')
    "heads_tile_64_without_loop": ("Real-model sizes", "heads past the first 64 of q or k not rotated"),
    "rotary_tile_32_pairs_without_loop": ("Real-model sizes", "pairs past the first 32 (rotary width > 64) not rotated"),
    "entry_tile_256_without_loop": ("Real-model sizes", "columns past 256 of a cache entry's row not written"),
    "token_grid_capped_at_65535": ("Real-model sizes", "tokens past 65,535 (CUDA grid y/z) not processed"),
    "positions_narrowed_to_16_bits": ("Real-model sizes", "positions read as uint16: 65,536 and above wrap"),
    "heads_x_pairs_tile_2048_without_loop": ("Real-model sizes",
                                             "(head, pair) past the first 2048 of heads x rotary pairs not rotated"),
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
    "prefill_dense_block_stride": ("Cache layout", "past 16 tokens, entries of 128 elements or more addressed with "
                                   "block stride block_size x entry size, not the view's (a K|V-halves pool)"),
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
    "fp8_scale_dropped_past_512_tokens": ("fp8", "a second path for launches past 512 tokens treats the scale as 1"),
    # Strides and aliasing
    "token_stride_ignored": ("Strides and aliasing", "token stride of q/k/kv_c assumed packed"),
    "one_head_stride_for_q_and_k": ("Strides and aliasing", "one head stride (the smaller) used for q and k"),
    "writes_to_copy": ("Strides and aliasing", "rope writes land in a contiguous copy"),
    "storage_offset_dropped": ("Strides and aliasing", "views addressed from storage offset 0"),
    "k_pe_read_with_kv_c_row_stride": ("Strides and aliasing", "a contiguous kv_c's fast path addresses a strided "
                                       "k_pe with kv_c's row stride"),
    "misaligned_vector_store": ("Strides and aliasing", "bf16 rotated halves (R/2 >= 8) stored with 16-byte vectors "
                                "as if aligned: a half not 16-byte aligned lands shifted to the aligned address below"),
    # Bad input (CONTRACT §4)
    "validates_after_writing": ("Padding and slots", "argument checks run after the writes"),
    "rotary_width_larger_than_head_accepted": ("RoPE geometry", "a table wider than the head accepted"),
}

#: Mutants that model a bug of a compiled kernel in eager code (see the module docstring of the suite).
APPROXIMATED = {
    "address_wraps_at_2_16": "int32 address overflow needs > 2^31 elements; the wrap is modelled at 2^16",
    "reads_slot_mapping_past_end": "an out-of-bounds masked load, modelled as reading the storage past the view",
    "positions_read_as_int32": "a pointer reinterpretation, modelled on a contiguous copy of the positions",
    "heads_tile_64_without_loop": "a kernel's fixed tile over heads, modelled by leaving the heads past it alone",
    "rotary_tile_32_pairs_without_loop": "a kernel's fixed tile over rotary pairs, modelled likewise",
    "entry_tile_256_without_loop": "a kernel's fixed tile over an entry's columns, modelled likewise",
    "token_grid_capped_at_65535": "a grid dimension capped at CUDA's limit, modelled by dropping the rows past it",
    "positions_narrowed_to_16_bits": "a narrow position type in a kernel, modelled by reducing positions mod 2^16",
    "heads_x_pairs_tile_2048_without_loop": "one tile over a head's pairs and the heads, modelled likewise",
    "misaligned_vector_store": "an aligned vector store at a misaligned address (a fault on x86 and CUDA), modelled "
                               "as the half's values written from the aligned address below (wrapping within the half)",
}

#: Variants without a bug (other declarations, honoured): the suite must pass them.
HONEST = {"none", "none_padded_q_only", "none_padded_skipped", "none_per_op_rounding"}
DECLARATIONS = {"none_padded_q_only": {"padded_rows": "q_only"}, "none_padded_skipped": {"padded_rows": "skipped"},
                "none_per_op_rounding": {"rounding": "per_op"}}
