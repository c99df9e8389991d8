"""SGLang's kernels (``sgl_kernel``) as an implementation of the contract (``--impl sglang``; CUDA only).

Read from SGLang's public code, github.com/sgl-project/sglang, ``sgl-kernel/`` (file names below are
in it; ``python/sgl_kernel/elementwise.py`` as of commits 0069435 and 263bc85, which agree here):

* ``rotary_embedding`` -> ``sgl_kernel.elementwise.apply_rope_with_cos_sin_cache_inplace`` (SGLang's
  CUDA rope; the contract's arguments in the same order). Its kernel is FlashInfer's
  (``csrc/elementwise/rope.cu`` -> the FlashInfer commit sgl-kernel pins in its CMakeLists.txt).
* ``rope_and_reshape_and_cache_flash`` -> the same call with ``fused_set_kv_buffer_arg=
  FusedSetKVBufferArg(value, k_buffer, v_buffer, k_scale=None, v_scale=None, cache_loc=slot_mapping)``
  (``csrc/elementwise/pos_enc.cuh``, BatchQKApplyRotaryPosIdsCosSinCacheEnhanced): q and k rotated in
  place, rotated k and v stored at row ``cache_loc[t]`` of ``k_buffer``/``v_buffer``.
* ``concat_and_cache_mla_rope_fused`` -> ``sgl_kernel.mla_rope_quantize_fp8_fused(q_nope, q_rope,
  k_nope, k_rope, cos_sin_cache, pos_ids, is_neox, q_out, k_nope_out, k_rope_out, kv_buffer,
  kv_cache_loc)`` (``csrc/elementwise/mla_rope_fp8_kv_fused.cu``) writes the cache row
  ``[fp8(kv_c) | fp8(rope(k_pe))]``; then ``apply_rope_with_cos_sin_cache_inplace`` rotates ``q_pe``
  and ``k_pe`` in place, because the fused kernel returns q only as fp8 (``q_out``, discarded here;
  its ``q_nope`` input must be L wide, so the adapter passes zeros) and never writes k back.

Where the contract and SGLang's conventions differ (refused before anything is written, with
``NotImplementedError``):

* SGLang's cache is token rows: ``k_buffer[loc]`` with one token stride. The contract's
  ``[NB, B, ...]`` cache is viewed as ``[NB * B, ...]`` (``token_rows``), possible only when the block
  stride is ``B`` times the entry stride (contiguous NHD and the like; not HND, not K and V
  interleaved in one pool).
* SGLang has no padding slot: both kernels write every token at ``cache_loc[t]`` with no check (a -1
  writes before the buffer). SGLang itself sends padded tokens to slot 0, which its pool reserves
  ("The padded slot 0 is used for writing dummy outputs from padded tokens",
  ``python/sglang/srt/mem_cache/memory_pool.py``). So a negative slot, or a slot_mapping shorter than
  the tokens, is refused.
* ``mla_rope_quantize_fp8_fused`` applies no scale (``float_to_e4m3fn_byte(x)``): a scale other than
  1 is refused. It writes E4M3 only.
* Sizes FlashInfer's rope kernels mishandle (``flashinfer.rope_size_problem``); the set-kv path
  supports head sizes 64, 128, 256 and 512 only (DISPATCH_HEAD_DIM, which raises otherwise); and
  the vectorized MLA path reads bf16/fp16 pairs without checking their alignment
  (``misaligned_pairs_problem``).
"""

from __future__ import annotations

import dataclasses
import importlib

import torch

from mla_fuse_conformance.contract.implementation import kernel_version
from mla_fuse_conformance.adapters.flashinfer import (HALF_DTYPES, ROPE, import_cuda_library, refuse,
                                                      rope_size_problem, source_bits_problem)

NOT_INSTALLED = "sgl_kernel is not installed: pip install sgl-kernel (needs a CUDA GPU)"


def token_rows(cache: torch.Tensor) -> torch.Tensor:
    """``cache [NB, B, ...]`` as ``[NB * B, ...]`` rows sharing its memory (row = slot), or NotImplementedError."""
    try:
        return cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])
    except RuntimeError:
        raise NotImplementedError(f"sgl_kernel addresses the cache as token rows (one stride per slot); a cache of "
                                  f"strides {tuple(cache.stride())} has no such view") from None


def every_token_written_problem(slot_mapping: torch.Tensor, tokens: int) -> str | None:
    if len(slot_mapping) != tokens:
        return (f"sgl_kernel writes every token at cache_loc[t]: slot_mapping has {len(slot_mapping)} entries for "
                f"{tokens} tokens")
    if bool((slot_mapping < 0).any()):  # host sync
        return "sgl_kernel has no padding slot (SGLang writes padded tokens to its reserved slot 0): slot -1"
    return None


def misaligned_pairs_problem(is_neox: bool, q_pe: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> str | None:
    """mla_rope_quantize_fp8_fused takes its vectorized path for GPT-J when L and R are multiples of 4
    (and q_out's strides are: the adapter's q_out is contiguous), and there loads two 16-bit values
    as one 4-byte word at each token (and head) row of q_pe, kv_c and k_pe without checking alignment."""
    if is_neox or kv_c.shape[-1] % 4 or k_pe.shape[-1] % 4:
        return None  # the scalar kernel
    for tensor in (q_pe, kv_c, k_pe):
        if tensor.data_ptr() % 4 or any(stride % 2 for stride in tensor.stride()[:-1]):
            return (f"mla_rope_quantize_fp8_fused: a row of a {tuple(tensor.shape)} input with strides "
                    f"{tuple(tensor.stride())} is not 4-byte aligned, which its vectorized path requires")
    return None


def unit_scale_problem(scale: torch.Tensor) -> str | None:
    value = float(scale.reshape(-1)[0])  # host sync
    return None if value == 1.0 else f"mla_rope_quantize_fp8_fused applies no scale: scale {value} is not 1"


# ---------------------------------------------------------------- declarations

# rotary_embedding: FlashInfer's rope (flashinfer.ROPE): elementwise.py "cos_sin_cache should be float32";
# _view_3d(key) (no key=None); rope.cu DISPATCH_PYTORCH_DTYPE_TO_CTYPE_FP16 and CHECK_INPUT(pos_ids) (contiguous:
# the wrapper's positions.long() copies int32 positions, but leaves strided int64 ones strided).
# Set-kv: elementwise.py asserts k_scale/v_scale None ("not yet supported") and cache_loc int64; rope.cu casts the
# buffers to the query's type (source bits) and CHECK_INPUT(kv_cache_loc); pos_enc.cuh kv_buffer_saver stores v
# with k's per-head layout (Dv = D); token rows (module docstring): NHD, contiguous.
SET_KV = dataclasses.replace(ROPE, kv_cache_dtypes=("auto", *HALF_DTYPES), slot_dtypes=("int64",),
                             distinct_value_head_size=False, cache_orders=("NHD",), cache_layouts=("contiguous",))
# mla_rope_fp8_kv_fused.cu: "Only FP16 and BF16"; pos_ids.data_ptr<int64_t>() and kv_cache_loc.data_ptr<int64_t>()
# (int64 only, read as contiguous: pos_ids[token], kv_cache_loc[token]); cos_sin_cache.data_ptr<float>(); E4M3
# bytes only; kv_buffer [rows, L + R] with one row stride (token rows).
MLA_FP8 = dataclasses.replace(ROPE, position_dtypes=("int64",), slot_dtypes=("int64",),
                              kv_cache_dtypes=("fp8", "fp8_e4m3"), cache_layouts=("contiguous",))


class SglangImplementation:
    """sgl_kernel's rope, rope with fused set-kv-buffer, and fused MLA rope+fp8+cache (module docstring)."""

    name = "sglang"
    rounding = "single"  # fp32 arithmetic, one cast on store (pos_enc.cuh; mla_rope_fp8_kv_fused.cu rope_rotate)
    padded_rows = "rotated"  # the in-place rope rotates every row (padded slots are refused: module docstring)
    checks_inputs = False
    capabilities = {"rotary_embedding": ROPE, "rope_and_reshape_and_cache_flash": SET_KV,
                    "concat_and_cache_mla_rope_fused": MLA_FP8}
    # the kernel calls a standalone reproducer inlines (commands/repro/script.py); the fused MLA operation goes through
    # this module's glue (a q_nope and q output to pass), so its reproducer imports the adapter instead
    call_source = {
        "rotary_embedding": "from sgl_kernel import elementwise\nelementwise.apply_rope_with_cos_sin_cache_inplace("
                            "positions, query, key, head_size, cos_sin_cache, is_neox)",
        "rope_and_reshape_and_cache_flash": (
            "from sgl_kernel import elementwise\n"
            "rows = lambda cache: cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])  # row = slot\n"
            "buffers = elementwise.FusedSetKVBufferArg(value=value, k_buffer=rows(key_cache), "
            "v_buffer=rows(value_cache), k_scale=None, v_scale=None, cache_loc=slot_mapping)\n"
            "elementwise.apply_rope_with_cos_sin_cache_inplace(positions, query, key, query.shape[2], cos_sin_cache, "
            "is_neox, fused_set_kv_buffer_arg=buffers)")}

    def __init__(self) -> None:
        self._kernels = import_cuda_library("sgl_kernel", NOT_INSTALLED)
        self.version = kernel_version("sgl_kernel")
        self._elementwise = importlib.import_module("sgl_kernel.elementwise")
        # Older sgl_kernel builds lack these: then the operation is not provided.
        if not hasattr(self._elementwise, "FusedSetKVBufferArg"):
            self.rope_and_reshape_and_cache_flash = None
        if not hasattr(self._kernels, "mla_rope_quantize_fp8_fused"):
            self.concat_and_cache_mla_rope_fused = None

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        refuse(rope_size_problem(head_size, cos_sin_cache.shape[1], is_neox))
        self._elementwise.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                                                is_neox)

    def rope_and_reshape_and_cache_flash(self, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                         cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale):
        head_size = query.shape[2]
        refuse(source_bits_problem(kv_cache_dtype, "sgl_kernel's fused set-kv-buffer")
               or every_token_written_problem(slot_mapping, query.shape[0])
               or rope_size_problem(head_size, cos_sin_cache.shape[1], is_neox))
        buffers = self._elementwise.FusedSetKVBufferArg(
            value=value, k_buffer=token_rows(key_cache), v_buffer=token_rows(value_cache), k_scale=None,
            v_scale=None, cache_loc=slot_mapping)
        self._elementwise.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                                                is_neox, fused_set_kv_buffer_arg=buffers)

    def concat_and_cache_mla_rope_fused(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                        kv_cache, kv_cache_dtype, kv_cache_scale):
        tokens, heads, rotary_dim = q_pe.shape
        latent = kv_c.shape[1]
        if kv_cache_dtype not in MLA_FP8.kv_cache_dtypes:
            raise NotImplementedError(f"mla_rope_quantize_fp8_fused: kv_cache_dtype {kv_cache_dtype!r}: it writes "
                                      "E4M3 only")
        refuse(unit_scale_problem(kv_cache_scale) or every_token_written_problem(slot_mapping, tokens)
               or rope_size_problem(rotary_dim, rotary_dim, is_neox)
               or misaligned_pairs_problem(is_neox, q_pe, kv_c, k_pe))
        rows = token_rows(kv_cache)
        q_nope = q_pe.new_zeros(1, 1, latent).expand(tokens, heads, latent)  # its width must be L; output unused
        q_out = torch.empty(tokens, heads, latent + rotary_dim, dtype=torch.uint8, device=q_pe.device)
        self._kernels.mla_rope_quantize_fp8_fused(q_nope, q_pe, kv_c, k_pe, cos_sin_cache, positions, is_neox, q_out,
                                                  None, None, rows, slot_mapping)
        self._elementwise.apply_rope_with_cos_sin_cache_inplace(positions, q_pe, k_pe, rotary_dim, cos_sin_cache,
                                                                is_neox)
