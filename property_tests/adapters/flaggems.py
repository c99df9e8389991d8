"""FlagGems' Triton kernels as an implementation of the contract (``--impl flaggems``).

FlagGems (``flag-gems``, BAAI's Triton operator library; written against 5.0.2, ``version`` says which
one ran) ships three of CONTRACT §4's operations:

* ``rotary_embedding``: ``apply_rotary_pos_emb_inplace_kernel`` of ``flag_gems/fused/rotary_embedding.py``,
  called as FlagGems' vLLM integration calls it (``flag_gems/patches/patch_vllm_all.py``,
  ``custom_gems_rope_forward_cuda``, which replaces vLLM's ``RotaryEmbedding.forward_cuda``);
* ``concat_and_cache_mla``: ``concat_and_cache_mla_kernel`` of ``flag_gems/fused/concat_and_cache_mla.py``
  (what the patch puts in place of vLLM's ``_C_cache_ops.concat_and_cache_mla``);
* ``reshape_and_cache_flash``: ``reshape_and_cache_flash_kernel`` of ``flag_gems/fused/reshape_and_cache_flash.py``
  (what the patch calls from vLLM's ``FlashAttentionImpl.forward``).

Finding the package (``package_dir``): ``$MLA_FUSE_FLAGGEMS_PATH``, a directory holding ``flag_gems/`` (an
unpacked wheel: ``unzip flag_gems-5.0.2-py3-none-any.whl -d DIR``), else the installed package
(``importlib.util.find_spec``, which does not import it). Its version is read from the
``flag_gems-*.dist-info`` beside it. Nothing of FlagGems is imported: ``import flag_gems`` detects a device
and raises without one, and the wheel pins numpy, sqlalchemy, pyyaml and packaging exactly; its files are
read instead, so an unpacked wheel needs none of its dependencies.

Loading (``load_kernels``): each kernel file is parsed with ``ast`` and the kernel definition compiled
alone under the file's name and line numbers with the real ``triton`` and ``tl``
(``running/foreign_kernels.py``, shared with ``--impl vllm-triton``). What each file needs of FlagGems:

* every kernel is decorated ``@libentry()`` then ``@triton.jit``: ``libentry`` (``flag_gems/utils/libentry.py``)
  is a launch cache keyed per device that then calls the same ``JITFunction``; it is left out (so nothing
  of ``flag_gems.runtime``'s device detection runs) and the kernel launched as ``@triton.jit`` built it;
* ``concat_and_cache_mla.py``: its module constants ``FP8_KV_CACHE_DATA_TYPE_*`` (``tl.constexpr``), taken
  from the file;
* ``rotary_embedding.py``: ``tle.program_id`` (``flag_gems/utils/triton_lang_extension.py``, a ``@triton.jit``
  helper: ``tl.program_id(axis).to(tl.int64)``), loaded from that file the same way and handed to the kernel
  as the module ``tle``;
* ``torch_device_fn.device(...)`` around each launch: ``torch.cuda.device`` on a GPU, nothing under the
  interpreter.

Backend: the one ``mla_fuse.kernels`` chose for the process (``InterpretedFunction`` or ``JITFunction``); no
setting changes. Under the interpreter the fp8 conversions are made exact (``corrected_interpreter``,
triton#8322), as for vllm-triton, and the rope's fp32 -> bf16 store rounds to nearest even as on a GPU
(the interpreter truncates); on a GPU nothing is replaced.

The glue mirrors FlagGems' wrappers statement by statement; what it bypasses or adds:

* ``use_c_extension`` (``flag_gems/config.py``): the pure-Python branch (the wheel has no C extension);
* ``ConcatAndCacheMla`` is an ``autograd.Function``: its ``forward`` is run directly (no autograd here);
* ``concat_and_cache_mla``: ``kv_cache_dtype`` is passed unchanged, as FlagGems' vLLM patch passes vLLM's
  (``patch_vllm_all.py`` ``custom_concat_and_cache_mla``; vLLM's ``ops.concat_and_cache_mla(...,
  kv_cache_dtype=kv_cache_dtype)``, ``vllm/v1/attention/backend.py:1108``, the configured ``CacheDType``,
  ``vllm/config/cache.py:39``). FlagGems' ``kv_dtype_map`` spells the fp8 formats ``fp8e4m3`` /
  ``fp8e5m2``, so vLLM's ``fp8_e4m3`` / ``fp8_e5m2`` raise ``Unsupported kv_cache_dtype``: in the vLLM
  deployments FlagGems serves, a failure (docs/THIRD_PARTY.md);
* ``reshape_and_cache_flash``: then, as the patch's ``FlashAttentionImpl.forward`` does right after the write
  (``patch_vllm_all.py:185``), ``NotImplementedError`` for an fp8 ``kv_cache_dtype``: the cache is written
  first (FlagGems' flash write reads no scale and has no fp8 store), the forward raises after;
* ``rotary_embedding``: the patch's ``cos_sin_cache.chunk(2, dim=-1)``, ``query.view(T, -1, head_size)``,
  the rotary slices and ``apply_rotary_pos_emb(..., inplace=True)``; the patch's closing ``torch.cat`` of the
  rotated and pass-through parts builds a copy vLLM returns, the in-place writes having already landed in
  ``query`` and ``key``: the contract's operation is in place, so the copy is not made.

Declared limits (``CAPABILITIES``), each what FlagGems enforces (a raise, an assert, a dispatch) or what its
vLLM integration never passes (``GUARDED_BY_CALLER``: the caller's line). Which of vLLM's calls it stands in
for (``SERVES``): the patch replaces ``_C_cache_ops.concat_and_cache_mla`` for every vLLM MLA backend
(``patch_vllm_all.py:605``) and ``FlashAttentionImpl.forward`` (``:590``, the ``vllm-flash`` layout); those
deployments run whatever is declared.
"""

from __future__ import annotations

import pathlib
import types

import torch
import triton
import triton.language as tl

from mla_fuse import kernels as mla_fuse_kernels  # not `kernels`: this adapter's kernels are the third party's

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.declarations.vllm_callers import VLLM_HEADS, VLLM_SLOTS
from mla_fuse_conformance.running.foreign_kernels import (find_package, load_jit_functions, module_constants,
                                                          package_version)
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

PATH_ENV_VAR = "MLA_FUSE_FLAGGEMS_PATH"
NOT_FOUND = (f"FlagGems is not found: set {PATH_ENV_VAR} to a directory holding flag_gems/ (`pip download --no-deps "
             "flag-gems==5.0.2` and unzip the wheel into it), or install it (`pip install --no-deps flag-gems`); only "
             "its kernel files are read, nothing of it is imported")
ROPE_FILE, MLA_FILE, FLASH_FILE = "fused/rotary_embedding.py", "fused/concat_and_cache_mla.py", \
    "fused/reshape_and_cache_flash.py"
TLE_FILE = "utils/triton_lang_extension.py"
DECORATORS = ["libentry()", "triton.jit"]
MLA_CONSTANTS = ("FP8_KV_CACHE_DATA_TYPE_AUTO", "FP8_KV_CACHE_DATA_TYPE_FP8E4M3", "FP8_KV_CACHE_DATA_TYPE_FP8E5M2")
PATCH = "flag_gems/patches/patch_vllm_all.py"
CAPABILITIES = {
    # custom_gems_rope_forward_cuda calls key.view(...): key is required; and query.view(num_tokens, -1, head_size)
    # (patch_vllm_all.py:34) raises RuntimeError for 0 tokens, before anything is written: no empty batch.
    "rotary_embedding": Capabilities(key_optional=False, empty_batch=False),
    # ConcatAndCacheMla.forward (fused/concat_and_cache_mla.py:110-118): kv_dtype_map takes auto, fp8, fp8e4m3,
    # fp8e5m2, any other name raises "Unsupported kv_cache_dtype" (of the contract's: auto and fp8); :105 "For FP8
    # kv_cache must be uint8 dtype"; BLOCK_SIZE = min(kv_lora_rank, 512) feeds tl.arange, which raises on a
    # non-power of two; the slot mapping is never strided where vLLM calls it (GUARDED_BY_CALLER).
    "concat_and_cache_mla": Capabilities(kv_cache_dtypes=("auto", "fp8"), fp8_storage=("uint8",),
                                         latent_dims=tuple(2 ** i for i in range(10)), strided_index_tensors=False),
    # the patch's FlashAttentionImpl.forward raises NotImplementedError for an fp8 kv_cache_dtype (:185, after
    # the write); fused/reshape_and_cache_flash.py:93 asserts key_cache.stride(0) == value_cache.stride(0), which
    # a value head size other than the key's fails before anything is written; the slot mapping is never strided
    # where vLLM calls it, and neither are a token's heads: vLLM's key and value are [T, Hkv, D] views of column
    # slices (GUARDED_BY_CALLER), which the kernel reads right; it reads a token's heads as packed
    # (``token * key.stride(0) + h * D + d``), so a key or value whose head stride is not D (the contract's
    # ``head stride: other``) is checked as a limit and found unguarded. Not declared, because FlagGems neither
    # documents nor enforces it and vLLM reaches it (a finding where it fails): a cache whose entries are not
    # packed NHD (HND, K and V in one pool).
    "reshape_and_cache_flash": Capabilities(kv_cache_dtypes=("auto", "float32", "bfloat16", "float16"),
                                            distinct_value_head_size=False, strided_index_tensors=False,
                                            unpacked_heads=False),
}
GUARDED_BY_CALLER = {"concat_and_cache_mla": {"slot_mapping layout strided": VLLM_SLOTS},
                     "reshape_and_cache_flash": {"slot_mapping layout strided": VLLM_SLOTS,
                                                 "head stride other": VLLM_HEADS}}
SERVES = {"concat_and_cache_mla": ("vllm-mla",), "reshape_and_cache_flash": ("vllm-flash",)}


def package_dir() -> pathlib.Path:
    """The ``flag_gems`` package directory: ``${PATH_ENV_VAR}/flag_gems``, else the installed one."""
    return find_package("flag_gems", PATH_ENV_VAR, MLA_FILE, NOT_FOUND, "flag-gems")


def load_kernels(package: pathlib.Path, interpreted: bool, sources: dict[str, str] | None = None) -> dict:
    """Kernel name -> the kernel built for the backend (module docstring). ``sources`` replaces a kernel
    file's text by its path relative to ``package`` (a planted kernel in the tests)."""
    sources = sources or {}
    base = {"triton": triton, "tl": tl}
    tle = types.ModuleType("flag_gems.utils.triton_lang_extension")
    tle.program_id = load_jit_functions(package / TLE_FILE, {"program_id": ["triton.jit"]}, base,
                                        interpreted)["program_id"]
    kernels = {}
    for relative, name, namespace in (
            (ROPE_FILE, "apply_rotary_pos_emb_inplace_kernel", {**base, "tle": tle}),
            (MLA_FILE, "concat_and_cache_mla_kernel", {**base, **module_constants(package / MLA_FILE, MLA_CONSTANTS,
                                                                                  base)}),
            (FLASH_FILE, "reshape_and_cache_flash_kernel", base)):
        kernels.update(load_jit_functions(package / relative, {name: DECORATORS}, namespace, interpreted,
                                          sources.get(relative)))
    return kernels


class FlagGemsImplementation:
    """FlagGems' rope, MLA cache write and flash cache write (module docstring)."""

    rounding = "single"  # fp32 products and sum (cos/sin loaded as fp32), one rounding on store
    padded_rows = "rotated"  # no fused operation: rope has no slot mapping
    checks_inputs = False  # asserts and a few ValueErrors, not the contract's checks
    exact_fp8_store = True  # under the interpreter, exact float conversions (running/interpreter_corrections.py)
    capabilities = CAPABILITIES
    serves = SERVES  # the vLLM calls its patch stands in for (module docstring)
    guarded_by_caller = GUARDED_BY_CALLER

    def __init__(self, sources: dict[str, str] | None = None) -> None:
        package = package_dir()
        self.interpreted = mla_fuse_kernels.INTERPRETED
        self.kernels = load_kernels(package, self.interpreted, sources)
        backend = "Triton interpreter" if self.interpreted else "GPU"
        self.name = f"flaggems ({backend})"
        self.version = package_version(package)
        self.kernel_file = ", ".join(str(package / f) for f in (ROPE_FILE, MLA_FILE, FLASH_FILE))

    def _launch(self, name, grid, *args, **kwargs):
        kernel = self.kernels[name]
        if self.interpreted:
            with corrected_interpreter() if self.exact_fp8_store else uncorrected_interpreter():
                kernel[grid](*args, **kwargs)
        else:
            with torch.cuda.device(args[0].device):  # torch_device_fn.device(...)
                kernel[grid](*args, **kwargs)

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        """patch_vllm_all.py ``custom_gems_rope_forward_cuda`` (rotary_dim = the table's width), then
        rotary_embedding.py ``apply_rotary_pos_emb(..., inplace=True)`` with ``position_ids``."""
        rotary_dim = cos_sin_cache.shape[-1]
        positions = positions.flatten()
        num_tokens = positions.shape[0]
        query = query.view(num_tokens, -1, head_size)
        key = key.view(num_tokens, -1, head_size)
        q, k = query[..., :rotary_dim], key[..., :rotary_dim]
        cos, sin = cos_sin_cache.chunk(2, dim=-1)
        # apply_rotary_pos_emb (its asserts, then the in-place branch)
        assert k.shape[-1] == q.shape[-1] and cos.shape[-1] == sin.shape[-1] and cos.shape[-1] * 2 == q.shape[-1]
        assert cos.stride(-1) == 1 and sin.stride(-1) == 1 and q.shape[:-2] == k.shape[:-2]
        assert positions.shape == q.shape[:-2]
        position_ids = positions.view(-1)
        q = q.view(-1, q.shape[-2], q.shape[-1])
        k = k.view(-1, k.shape[-2], k.shape[-1])
        n_tokens, _, rot = q.shape
        padded_head_dim = max(triton.next_power_of_2(rot), 16)
        self._launch("apply_rotary_pos_emb_inplace_kernel", (n_tokens,), q, k, cos, sin, position_ids, q.stride(0),
                     q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), position_ids.stride(0),
                     cos.stride(0), sin.stride(0), None, q.shape[-2], k.shape[-2], rot, padded_head_dim,
                     not is_neox, MAX_POSITION_EMBEDDINGS=cos.shape[0])

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        """concat_and_cache_mla.py ``ConcatAndCacheMla.forward``, statement by statement."""
        if kv_cache_dtype != "auto" and kv_cache.dtype != torch.uint8:
            raise ValueError("For FP8 kv_cache must be uint8 dtype")
        if kv_cache_dtype == "auto" and kv_cache.dtype != kv_c.dtype:
            raise ValueError("For auto mode kv_cache must match input dtype")
        kv_dtype_map = {"auto": 0, "fp8": 1, "fp8e4m3": 1, "fp8e5m2": 2}  # FP8_KV_CACHE_DATA_TYPE_*
        kv_dtype = kv_dtype_map.get(kv_cache_dtype)
        if kv_dtype is None:
            raise ValueError(f"Unsupported kv_cache_dtype: {kv_cache_dtype}")
        kv_lora_rank, pe_dim, num_tokens = kv_c.size(1), k_pe.size(1), slot_mapping.size(0)
        if scale.numel() != 1:
            scale = scale.view(1)
        block_size = min(kv_lora_rank, 512)
        assert kv_cache.dim() == 3, "kv_cache must be a 3D tensor"
        assert kv_cache.size(2) == kv_lora_rank + pe_dim, "kv_cache's last dimension must match kv_lora_rank + pe_dim"
        self._launch("concat_and_cache_mla_kernel", (num_tokens,), kv_c, k_pe, kv_cache, slot_mapping,
                     kv_cache.stride(0), kv_cache.stride(1), kv_c.stride(0), k_pe.stride(0), kv_lora_rank, pe_dim,
                     kv_cache.size(1), scale, kv_dtype=kv_dtype, BLOCK_SIZE=block_size)

    def reshape_and_cache_flash(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                v_scale):
        """reshape_and_cache_flash.py ``reshape_and_cache_flash``, the pure-Python branch."""
        num_tokens, num_heads, head_size = slot_mapping.size(0), key.size(1), key.size(2)
        block_size = key_cache.size(1)
        assert key_cache.stride(0) == value_cache.stride(0)
        self._launch("reshape_and_cache_flash_kernel", (num_tokens,), key, value, key_cache, value_cache,
                     slot_mapping, key_cache.stride(0), key.stride(0), value.stride(0), num_heads, head_size,
                     block_size, k_scale, v_scale, num_heads * head_size)
        if kv_cache_dtype.startswith("fp8"):  # the patch's FlashAttentionImpl.forward, right after the write
            raise NotImplementedError("FP8 quantization is not yet supported for FlashAttentionImpl")


__all__ = ["CAPABILITIES", "FlagGemsImplementation", "GUARDED_BY_CALLER", "SERVES", "PATH_ENV_VAR", "load_kernels", "package_dir"]
