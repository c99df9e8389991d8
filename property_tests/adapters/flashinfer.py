"""FlashInfer's kernels as an implementation of the contract (``--impl flashinfer``; CUDA only).

Read from FlashInfer's public code, github.com/flashinfer-ai/flashinfer at commit fb28d72
(version 0.6.18); file names below are in that repository. The operations:

* ``rotary_embedding`` -> ``flashinfer.rope.apply_rope_with_cos_sin_cache_inplace`` (the contract's
  arguments, in the same order).
* ``concat_and_cache_mla`` -> ``flashinfer.page.append_paged_mla_kv_cache`` on the two column views
  ``kv_cache[..., :L]`` (ckv) and ``kv_cache[..., L:]`` (kpe). It copies the source bits: no
  kv_cache_dtype, no scale. Its docstring: "current only support ckv=512 and kpe=64"
  (include/flashinfer/page.cuh, AppendPagedKVMlaCache checks it and raises otherwise).
* ``reshape_and_cache_flash`` -> ``flashinfer.page.append_paged_kv_cache`` with the tuple
  ``(key_cache, value_cache)`` and ``kv_layout="NHD"``: the kernel reads page, entry and head strides
  from the tensors (page.cuh, the ``paged_kv_t`` constructor with ``kv_strides``), so any dim order
  with an inner stride of 1 is the NHD view of itself. Source bits only; head_dim must be 64, 128,
  256 or 512 (page.cuh, DISPATCH_HEAD_DIM, which raises otherwise).
* ``concat_and_cache_mla_rope_fused`` / ``rope_and_reshape_and_cache_flash`` ->
  ``flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache`` writes the cache (RoPE of k, fp8
  quantization, append, one kernel), then ``apply_rope_with_cos_sin_cache_inplace`` rotates q and k
  in place. Two launches, because the fused kernel returns q only as fp8 (``q_rope_out``) and never
  writes k back, while the contract rotates ``q_pe``/``k_pe`` (query/key) in place in their own
  dtype. The fused kernel takes fp8 caches only and one ``quant_scale_kv`` (a host float that
  *multiplies*: the adapter passes ``1 / scale``, read with a host sync) for K and V.

Slot mapping -> page table (``single_sequence_page_table``, ``slot_batch_positions``): FlashInfer
addresses a token through a page table, not a slot: token ``t`` of request ``b = batch_indices[t]``
goes to page ``kv_indices[p]``, entry ``e``, where ``p, e = divmod(kv_indptr[b] * B + positions[t], B)``
(page.cuh, AppendPagedKVCacheKernel; pos_enc.cuh, RopeQuantizeAppendPagedKVCacheKernel). The adapter
declares the whole cache one request whose pages are blocks ``0..NB-1`` in order (``kv_indices =
arange(NB)``, ``kv_indptr = [0, NB]``, ``kv_last_page_len = [B]``) and gives each written token
``b = 0``, ``position = slot``: then ``p, e = divmod(slot, B)``, the contract's block and offset.
A token that must not be written (slot < 0, or past a short slot_mapping) gets ``b = -1``: the fused
kernel skips it ("skip padding tokens with batch_indices < 0"); the plain appends have no such test
(they would read ``kv_indptr[-1]``), so the adapter passes them only the written rows
(``written_rows``: a gather, and a host sync to count them).

Sizes FlashInfer does not support, refused here before any launch (``NotImplementedError``: there is
no capability for sizes, and these kernels would read and write out of bounds rather than raise):
``rope_size_problem`` and ``fused_size_problem`` below.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util

import torch

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.contract.implementation import kernel_version
from mla_fuse_conformance.declarations.dtypes import FLOAT_DTYPES, FP8_FORMAT_OF_KV_CACHE_DTYPE

NOT_INSTALLED = "flashinfer is not installed: pip install flashinfer-python (needs a CUDA GPU)"
FLOAT8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_DTYPES = {name: FLOAT8[fmt] for name, fmt in FP8_FORMAT_OF_KV_CACHE_DTYPE.items()}
SOURCE_BITS = ("auto", *FLOAT_DTYPES)  # kv_cache_dtypes that store the source bits
HALF_DTYPES = ("bfloat16", "float16")
INT32_MAX = 2 ** 31 - 1


def import_cuda_library(name: str, not_installed: str):
    """Import the CUDA-only package ``name``, or raise one clear line: not installed, or no CUDA device."""
    if importlib.util.find_spec(name) is None:
        raise ImportError(not_installed)
    if not torch.cuda.is_available():
        raise RuntimeError(f"{name} needs a CUDA device; none is visible (torch.cuda.is_available() is False)")
    return importlib.import_module(name)


def refuse(problem: str | None) -> None:
    """Raise for an input the library's API cannot express (before anything is written)."""
    if problem:
        raise NotImplementedError(problem)


# ---------------------------------------------------------------- slot mapping -> page table


def single_sequence_page_table(num_blocks: int, block_size: int, device) -> tuple[torch.Tensor, ...]:
    """``(kv_indices, kv_indptr, kv_last_page_len)``, int32: the cache as one request over blocks 0..NB-1."""
    if num_blocks * block_size > INT32_MAX:
        raise NotImplementedError(f"flashinfer: a cache of {num_blocks} x {block_size} slots is not addressable "
                                  "(its page positions are int32)")
    kv_indices = torch.arange(num_blocks, dtype=torch.int32, device=device)
    kv_indptr = torch.tensor([0, num_blocks], dtype=torch.int32, device=device)
    kv_last_page_len = torch.tensor([block_size], dtype=torch.int32, device=device)
    return kv_indices, kv_indptr, kv_last_page_len


def slot_batch_positions(slot_mapping: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(batch_indices, positions)``, int32 ``[num_tokens]``: ``(0, slot)`` for a token written at ``slot``,
    ``(-1, 0)`` for one that is not (``slot < 0``, or ``t >= len(slot_mapping)``)."""
    batch_indices = torch.full((num_tokens,), -1, dtype=torch.int32, device=slot_mapping.device)
    positions = torch.zeros(num_tokens, dtype=torch.int32, device=slot_mapping.device)
    slots = slot_mapping.to(torch.int64)
    written = slots >= 0
    batch_indices[:len(slots)] = torch.where(written, 0, -1).to(torch.int32)
    positions[:len(slots)] = torch.where(written, slots, 0).to(torch.int32)
    return batch_indices, positions


def written_rows(batch_indices, positions, *rows_of):
    """The arguments of a plain append restricted to the tokens it must write (``batch_indices >= 0``);
    unchanged when every token is written, so strided inputs reach the kernel as they are."""
    keep = batch_indices >= 0
    if bool(keep.all()):  # host sync
        return (batch_indices, positions, *rows_of)
    rows = keep.nonzero().squeeze(1)
    return (batch_indices[rows], positions[rows], *(tensor.index_select(0, rows) for tensor in rows_of))


# ---------------------------------------------------------------- sizes the kernels handle (16-bit inputs)


def rope_size_problem(head_size: int, rotary_dim: int, is_neox: bool) -> str | None:
    """``BatchQKApplyRotaryPosIdsCosSinCache`` (include/flashinfer/pos_enc.cuh) rotates whole vectors of
    ``lanes`` elements: 8 when head_size is 64, 128 or 256 (``max(16 / 2, head_dim / 32)``), else 16 (512,
    and every other head_size, which goes through ``RopeQuantize`` with ``32 / 2``). A vector that
    straddles rotary_dim (or, NeoX, rotary_dim / 2) is rotated with the wrong partners and written whole."""
    lanes = 8 if head_size in (64, 128, 256) else 16
    step = 2 * lanes if is_neox else lanes
    if rotary_dim % step:
        return (f"apply_rope_with_cos_sin_cache_inplace: rotary_dim {rotary_dim} is not a multiple of {step} "
                f"(head_size {head_size}, {_style(is_neox)}): the kernel rotates {lanes}-element vectors")
    return None


def fused_size_problem(rotary_dim: int, nope_dim: int, is_neox: bool) -> str | None:
    """``RopeQuantizeAppendPagedKVCacheKernel`` (pos_enc.cuh): 16-element vectors (``32 / 2``) over the
    rotary part, and the non-rotary part in unguarded chunks of rotary_dim elements."""
    step = 32 if is_neox else 16
    if rotary_dim % step:
        return (f"rope_quantize_fp8_append_paged_kv_cache: rotary_dim {rotary_dim} is not a multiple of {step} "
                f"({_style(is_neox)})")
    if nope_dim % rotary_dim:
        return (f"rope_quantize_fp8_append_paged_kv_cache: the {nope_dim} non-rotary elements are not a multiple of "
                f"rotary_dim {rotary_dim} (copied in unguarded chunks of rotary_dim)")
    return None


def _style(is_neox: bool) -> str:
    return "NeoX" if is_neox else "GPT-J"


def fp8_dtype(kv_cache_dtype: str) -> torch.dtype:
    if kv_cache_dtype not in FP8_DTYPES:
        raise NotImplementedError(f"rope_quantize_fp8_append_paged_kv_cache: kv_cache_dtype {kv_cache_dtype!r}: "
                                  "it writes fp8 caches only")
    return FP8_DTYPES[kv_cache_dtype]


def source_bits_problem(kv_cache_dtype: str, operation: str) -> str | None:
    if kv_cache_dtype in SOURCE_BITS:
        return None
    return f"{operation}: kv_cache_dtype {kv_cache_dtype!r}: it copies the source bits (no kv_cache_dtype, no scale)"


def one_scale(*scales: torch.Tensor) -> float:
    """The one scale all of ``scales`` hold (host sync); FlashInfer takes a single float for K and V."""
    values = torch.cat([scale.reshape(-1) for scale in scales])
    if not bool((values == values[0]).all()):
        raise NotImplementedError("rope_quantize_fp8_append_paged_kv_cache: k_scale and v_scale differ (or differ "
                                  "per head): it takes one quant_scale_kv for K and V")
    return float(values[0])


# ---------------------------------------------------------------- declarations

# flashinfer/rope.py, apply_rope_with_cos_sin_cache_inplace: "cos_sin_cache should be float32" (ValueError);
# key.view(...) unconditionally (no key=None). csrc/rope.cu, apply_rope_pos_ids_cos_sin_cache: inputs dispatched
# for float16/bfloat16 only (DISPATCH_DLPACK_DTYPE_TO_CTYPE_FP16), positions int32 or int64, CHECK_INPUT(pos_ids)
# (contiguous). pos_enc.cuh: nnz = 0 gives a grid of 0 blocks, an invalid launch.
# Sizes (``rope_size_problem`` below): head sizes 64/128/256 rotate 8-lane vectors, so widths that are
# multiples of 16 suit both styles.
ROPE = Capabilities(dtypes=HALF_DTYPES, table_dtypes="float32", key_optional=False, strided_index_tensors=False,
                    empty_batch=False, head_sizes=(64, 128, 256), rotary_dims=(16, 32, 64, 128))
# csrc/rope.cu, rope_quantize_append_paged_kv_cache: "Output dtype must be float8_e4m3fn or float8_e5m2" and
# rope.py: the caches must have that dtype; one float quant_scale_kv (no per-head scales). The MHA path writes V
# over rope_dim + no_rope_dim = D elements per head (pos_enc.cuh, "V processing"): Dv = D only.
# Sizes (``fused_size_problem``): R a multiple of 32 suits both styles, the non-rotary part a multiple of R.
FUSED_MLA = dataclasses.replace(ROPE, kv_cache_dtypes=tuple(FP8_DTYPES), per_head_scales=False, rotary_dims=(32, 64),
                                latent_dims=(128, 256, 512))
FUSED_FLASH = dataclasses.replace(FUSED_MLA, distinct_value_head_size=False)
# csrc/page.cu: the cache dtype is dispatched (DISPATCH_DLPACK_DTYPE_TO_CTYPE: no float32) and the appended rows
# are read as that type: source bits only. page.cuh, AppendPagedKVCache(/Mla): the grid is
# min(occupancy, ceil_div(nnz, num_sms)) * num_sms blocks, 0 for nnz = 0. append_paged_kv_cache checks
# append_value.size(2) == head_dim (page.cu): Dv = D only.
# flashinfer/page.py: append_paged_mla_kv_cache only L = 512, R = 64; append_paged_kv_cache head sizes 64, 128,
# 256, 512 (DISPATCH_HEAD_DIM raises for others).
APPEND_MLA = Capabilities(dtypes=HALF_DTYPES, kv_cache_dtypes=("auto", *HALF_DTYPES), empty_batch=False,
                          latent_dims=(512,), rotary_dims=(64,))
APPEND_FLASH = dataclasses.replace(APPEND_MLA, distinct_value_head_size=False, latent_dims=None, rotary_dims=None,
                                   head_sizes=(64, 128, 256, 512))


class FlashInferImplementation:
    """FlashInfer's rope, page-append and fused rope+fp8+append kernels (module docstring)."""

    name = "flashinfer"
    rounding = "single"  # fp32 arithmetic (vec_t<float>), one cast on store (pos_enc.cuh)
    padded_rows = "rotated"  # apply_rope_with_cos_sin_cache_inplace rotates every row; no padded row is written
    checks_inputs = False  # shape checks only; positions and slots are never range-checked
    capabilities = {"rotary_embedding": ROPE, "concat_and_cache_mla": APPEND_MLA,
                    "concat_and_cache_mla_rope_fused": FUSED_MLA, "reshape_and_cache_flash": APPEND_FLASH,
                    "rope_and_reshape_and_cache_flash": FUSED_FLASH}
    # the kernel call a standalone reproducer inlines (commands/repro/script.py); the cache operations go through
    # this module's page-table glue, so their reproducers import the adapter instead
    call_source = {"rotary_embedding": "import flashinfer.rope\nflashinfer.rope.apply_rope_with_cos_sin_cache_inplace("
                                       "positions, query, key, head_size, cos_sin_cache, is_neox)"}

    def __init__(self) -> None:
        import_cuda_library("flashinfer", NOT_INSTALLED)
        self.version = kernel_version("flashinfer")
        self._rope = importlib.import_module("flashinfer.rope")
        self._page = importlib.import_module("flashinfer.page")

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        refuse(rope_size_problem(head_size, cos_sin_cache.shape[1], is_neox))
        self._rope.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox)

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        refuse(source_bits_problem(kv_cache_dtype, "append_paged_mla_kv_cache"))
        tokens, latent = kv_c.shape
        batch_indices, positions, kv_c, k_pe = written_rows(*slot_batch_positions(slot_mapping, tokens), kv_c, k_pe)
        if tokens and not len(kv_c):
            return  # every row padded: nothing to write (T = 0 itself goes to the kernel: empty_batch)
        self._page.append_paged_mla_kv_cache(kv_c, k_pe, batch_indices, positions, kv_cache[..., :latent],
                                             kv_cache[..., latent:], *single_sequence_page_table(
                                                 kv_cache.shape[0], kv_cache.shape[1], kv_cache.device))

    def reshape_and_cache_flash(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                v_scale):
        refuse(source_bits_problem(kv_cache_dtype, "append_paged_kv_cache"))
        tokens = key.shape[0]
        batch_indices, positions, key, value = written_rows(*slot_batch_positions(slot_mapping, tokens), key, value)
        if tokens and not len(key):
            return  # every row padded: nothing to write
        self._page.append_paged_kv_cache(key, value, batch_indices, positions, (key_cache, value_cache),
                                         *single_sequence_page_table(key_cache.shape[0], key_cache.shape[1],
                                                                     key_cache.device), kv_layout="NHD")

    def concat_and_cache_mla_rope_fused(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping,
                                        kv_cache, kv_cache_dtype, kv_cache_scale):
        rotary_dim, latent = k_pe.shape[1], kv_c.shape[1]
        refuse(fused_size_problem(rotary_dim, latent, is_neox) or rope_size_problem(rotary_dim, rotary_dim, is_neox))
        fp8 = fp8_dtype(kv_cache_dtype)
        cache = kv_cache.view(fp8)  # uint8 bit patterns or float8: the same bytes
        q_nope = q_pe.new_zeros(1, 1, latent).expand(*q_pe.shape[:2], latent)  # its width must be L; output unused
        self._append_fused(q_pe, q_nope, k_pe, kv_c, None, (cache[..., :latent], cache[..., latent:]), positions,
                           cos_sin_cache, is_neox, slot_mapping, fp8, one_scale(kv_cache_scale))
        self._rope.apply_rope_with_cos_sin_cache_inplace(positions, q_pe, k_pe, rotary_dim, cos_sin_cache, is_neox)

    def rope_and_reshape_and_cache_flash(self, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                         cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale):
        head_size, rotary_dim = query.shape[2], cos_sin_cache.shape[1]
        refuse(fused_size_problem(rotary_dim, head_size - rotary_dim, is_neox)
               or rope_size_problem(head_size, rotary_dim, is_neox))
        fp8 = fp8_dtype(kv_cache_dtype)
        self._append_fused(query[..., :rotary_dim], query[..., rotary_dim:], key[..., :rotary_dim],
                           key[..., rotary_dim:], value, (key_cache.view(fp8), value_cache.view(fp8)), positions,
                           cos_sin_cache, is_neox, slot_mapping, fp8, one_scale(k_scale, v_scale))
        self._rope.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox)

    def _append_fused(self, q_rope, q_nope, k_rope, k_nope, value, caches, positions, cos_sin_cache, is_neox,
                      slot_mapping, fp8, scale):
        """rope_quantize_fp8_append_paged_kv_cache; its q outputs (fp8) are discarded."""
        batch_indices, slot_positions = slot_batch_positions(slot_mapping, q_rope.shape[0])
        kv_indices, kv_indptr, _ = single_sequence_page_table(caches[0].shape[0], caches[0].shape[1],
                                                              caches[0].device)
        self._rope.rope_quantize_fp8_append_paged_kv_cache(
            q_rope=q_rope, k_rope=k_rope, q_nope=q_nope, k_nope=k_nope, v=value, cos_sin_cache=cos_sin_cache,
            pos_ids=positions, paged_kv_cache=caches, kv_indices=kv_indices, kv_indptr=kv_indptr,
            batch_indices=batch_indices, positions=slot_positions, is_neox=is_neox, quantize_dtype=fp8,
            quant_scale_kv=1.0 / scale, page_size=caches[0].shape[1], kv_layout="NHD")
