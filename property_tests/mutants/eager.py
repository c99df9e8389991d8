"""The five operations of CONTRACT §4 in plain eager torch, for the mutants.

``EagerImplementation`` validates (CONTRACT §4: before any write), then runs the stages:
rope (``eager_rope``), fp8 (``eager_fp8``), paged cache writes (``eager_cache_writes``). fp32
math rounded once, explicit saturation before the fp8 cast, cache writes by address
arithmetic. Bug-free unless ``bug`` names one of ``bug_classes.BUG_CLASSES``.
"""

from __future__ import annotations

import torch

from mla_fuse import validation
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS
from mla_fuse_conformance.mutants.eager_cache_writes import CacheWriteStage
from mla_fuse_conformance.mutants.eager_fp8 import Fp8Stage
from mla_fuse_conformance.mutants.eager_rope import RopeStage


class EagerImplementation(RopeStage, Fp8Stage, CacheWriteStage):
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
            k = self._k_pe_as_read(kv_c, k_pe)  # k_pe itself but for one mutant
            original_k = k.clone()
            self._rope(positions, q_pe, cos_sin_cache, is_neox, self._rotated_rows("q", slot_mapping, q_pe), q_pe)
            self._rope(positions, k[:, None, :], cos_sin_cache, is_neox, self._rotated_rows("k", slot_mapping, q_pe),
                       q_pe)
            cached_k = self._k_for_cache(original_k[:, None, :], k[:, None, :], positions, cos_sin_cache,
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
