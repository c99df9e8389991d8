"""SGLang's Triton cache writes as an implementation of the contract (``--impl sglang-triton``).

Written against the ``sglang`` 0.5.23 wheel (``version`` says which one ran); a different adapter from
``--impl sglang`` (``adapters/sglang.py``: SGLang's CUDA ``sgl_kernel``, CUDA only). Two operations of
CONTRACT §4, each called as SGLang's engine calls it:

* ``concat_and_cache_mla`` -> ``sglang/kernels/ops/kvcache/mla_buffer.py``: the MLA pool's write
  (``MLATokenToKVPool._write_mla_kv_buffer``, ``sglang/srt/mem_cache/memory_pool.py:4980-5024``):
  ``set_mla_kv_buffer_triton(dst_buffer, loc, cache_k_nope, cache_k_rope)`` (line 4936) for the
  source-bits caches, the Triton path of ``_set_mla_kv_buffer_impl`` (mla_buffer.py:262-287: the one SGLang
  takes below SM90 and where the JIT CUDA path's alignment does not hold); and for an fp8 cache
  ``set_mla_kv_buffer_triton_fp8_quant(dst_buffer, loc, cache_k_nope, cache_k_rope, fp8_dtype)``
  (memory_pool.py:4995, the fused cast-and-write of its ROCm DSA branch). Only the cache write of
  ``concat_and_cache_mla``: SGLang's MLA pool has no rope in it.
* ``rope_and_reshape_and_cache_flash`` -> ``fused_qk_rope_reshape_and_cache`` of
  ``sglang/kernels/ops/attention/fused_qk_rope_reshape_and_cache.py``, as ``RotaryEmbedding.forward_cuda``
  calls it on ROCm with a fused set-kv-buffer argument (``sglang/srt/layers/rotary_embedding/base.py:477-507``;
  the argument built by ``create_fused_set_kv_buffer_arg``, ``sglang/srt/models/utils.py:357-365``):
  ``key.view(-1, Hkv, D)``, ``query.view(T, -1, D)``, ``q_out=query``, ``k_out=key`` (in place),
  ``flash_layout=True`` (the NHD pool), ``offs=None``, ``output_zeros=False``, ``swa_slot_mapping=None``.

Loading: ``$MLA_FUSE_SGLANG_PATH`` (a directory holding ``sglang/``: ``pip download --no-deps sglang==0.5.23``
then ``unzip`` the wheel), else the installed package (``find_spec``). Nothing of SGLang is imported: the
``@triton.jit`` kernels and helpers are compiled from the files (``running/foreign_kernels.py``), and so are
the wrappers ``set_mla_kv_buffer_triton``, ``set_mla_kv_buffer_triton_fp8_quant`` and
``fused_qk_rope_reshape_and_cache``, run as written with their kernels handed in. ``_set_mla_kv_buffer_impl``
cannot run as written (it imports ``sglang.srt.platforms`` and SGLang's JIT CUDA module): ``_set_mla_impl``
mirrors its Triton branch line by line. ``is_arch_support_pdl`` (``sglang/kernels/jit/utils.py``) is False
(no PDL launch: the interpreter, and the below-SM90 GPUs whose path this is).

SGLang's conventions, and how the contract's cases map onto them:

* the MLA pool is token rows ``[size + page_size, 1, L + R]`` (memory_pool.py:4866) and the kernels take
  ``kv_buffer.stride(0)``: the contract's ``[NB, B, L + R]`` cache is viewed as ``[NB * B, 1, L + R]``
  (row = slot), possible when the block stride is ``B`` entry strides; otherwise refused
  (``NotImplementedError``). SGLang allocates each layer's buffer on its own (memory_pool.py:4864-4871), never
  a view into a larger pool: declared ``cache_layouts=("contiguous",)``; a view into a pool is checked as a
  limit (refused where it has no token-row view, handled where it has one). The latent and
  rope parts are passed as ``[T, 1, L]`` and ``[T, 1, R]`` (``kv_a.unsqueeze(1)``, as SGLang's MLA forward).
* padded tokens point at a reserved slot, 0 (``reserved_skip_index=0``, the wrappers' default,
  mla_buffer.py:296 and 405; "Slot 0 is reserved for CUDA-graph padding by default", line 194; the pool keeps
  row 0 for it, memory_pool.py:4863). Declared ``padding_slot=0`` for both operations: the suite's padded
  tokens point at slot 0, no real token is given slot 0, and slot 0's contents are not judged. The fused
  flash kernel skips negative slots (``if pid_slot >= 0``) but SGLang pads it with slot 0 too
  (``forward_batch.out_cache_loc``).
* an fp8 MHA pool is read through ``get_key_buffer``'s ``view(self.dtype)`` (memory_pool.py:2849): a uint8 cache is
  handed to the kernel as its float8 view, as the pool hands it. E4M3 is ``torch.float8_e4m3fn`` (SGLang's
  fnuz choice on MI300 is not a contract format).
* ``set_mla_kv_buffer_triton_fp8_quant`` takes no scale (its signature): a scale other than 1 cannot be passed
  and is refused (``scales=("1",)``); it writes ``fp8_dtype``, which is E4M3 only (memory_pool.py:4991:
  ``self.dtype == fp8_dtype``). An ``fp8_e5m2`` MLA pool takes the pool's other branch (torch's ``.to`` and a
  byte copy: torch, not this kernel), so it is declared unsupported here.
* the fused flash operation: ``k_scale``/``v_scale`` are passed for an fp8 cache (``layer.k_scale``) and None
  otherwise (a layer without an fp8 cache has ``k_scale`` None, ``radix_attention.py:94``).

Under the interpreter: ``corrected_interpreter`` (``running/interpreter_corrections.py``: fp8 and bf16, and
the mask ``mask & is_valid`` of mla_buffer.py:80, a block and a scalar comparison, which the interpreter
typed int32 and refused) during each interpreted launch, as for ``--impl vllm-triton``, and
``interpreted_helpers`` (below); nothing is replaced on a GPU.

Declared limits (``CAPABILITIES``), each from an assert, a signature or a dispatch line of SGLang.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import typing

import torch
import triton
import triton.language as tl
from triton.language import standard
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from mla_fuse import kernels as mla_fuse_kernels

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.running.foreign_kernels import (find_package, load_functions,
                                                          load_jit_functions, package_version)
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter

PATH_ENV_VAR = "MLA_FUSE_SGLANG_PATH"
MLA_FILE = "kernels/ops/kvcache/mla_buffer.py"
FUSED_FILE = "kernels/ops/attention/fused_qk_rope_reshape_and_cache.py"
NOT_FOUND = (f"SGLang is not found: set {PATH_ENV_VAR} to a directory holding sglang/ (`pip download --no-deps "
             "sglang==0.5.23 -d DIR` and unzip the wheel there); only its kernel files are read")
MLA_KERNELS = ("set_mla_kv_buffer_kernel", "set_mla_kv_buffer_fp8_quant_kernel")
MLA_WRAPPERS = ("set_mla_kv_buffer_triton", "set_mla_kv_buffer_triton_fp8_quant")
FUSED_KERNELS = ("_get_gptj_rotated_x", "_get_neox_rotated_x", "_unit_rope", "_load_cos_sin",
                 "_fused_qk_rope_reshape_and_cache_kernel")
FUSED_WRAPPER = "fused_qk_rope_reshape_and_cache"
E4M3_NAMES = ("fp8", "fp8_e4m3")
FP8_DTYPE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
POWERS_OF_TWO = tuple(2 ** n for n in range(0, 13))
RESERVED_SLOT = 0  # reserved_skip_index's default (mla_buffer.py:296, 405)

# concat_and_cache_mla:
# * memory_pool.py:4991 (``self.dtype == fp8_dtype``) sends E4M3 pools only to the fp8 kernel: not fp8_e5m2;
# * set_mla_kv_buffer_triton_fp8_quant (mla_buffer.py:398-405) has no scale argument: scale 1 only;
# * reserved_skip_index=0 (mla_buffer.py:296, 405): padded tokens at slot 0;
# * each layer's buffer is an allocation of its own, token rows (memory_pool.py:4864-4871): a contiguous cache;
# * the slot mapping (``loc``, ``forward_batch.out_cache_loc``) is never strided where SGLang calls it
#   (``GUARDED_BY_CALLER``; the kernel reads ``loc_ptr + pid``, mla_buffer.py:41, so the limit is checked).
MLA = Capabilities(kv_cache_dtypes=("auto", "float32", "bfloat16", "float16", *E4M3_NAMES), scales=("1",),
                   cache_layouts=("contiguous",), padding_slot=RESERVED_SLOT, strided_index_tensors=False)
# rope_and_reshape_and_cache_flash (fused_qk_rope_reshape_and_cache.py):
# * line 629: ``d == dk == dv``: Dv = D; line 638: D a power of two; line 639: block_size a power of two;
# * line 644: the table's width is D or 2D: R = D (no partial rotary);
# * flash_layout=True takes [NB, B, Hkv, D] caches with their strides (lines 690-702): every order;
# * padded tokens at slot 0 (create_fused_set_kv_buffer_arg: ``slot_mapping: forward_batch.out_cache_loc``).
# * one k_scale / v_scale per layer (radix_attention.py:94, a layer's ``k_scale``): no per-head scales
#   (``GUARDED_BY_CALLER``: the kernel reads the first scale, ``tl.load(k_scale_ptr)``, so the limit is checked);
# * base.py:493 ``query.view(tokens, -1, qk_head_dim)`` raises for 0 tokens (-1 is ambiguous): no empty batch;
# * base.py:499 passes ``self.cos_sin_cache``, which SGLang keeps float32 on ROCm (base.py:119, 206-210;
#   ``GUARDED_BY_CALLER``: the kernel computes in the table's dtype, so the limit is checked);
# * positions and the slot mapping are never strided where SGLang calls it (``GUARDED_BY_CALLER``; the kernel
#   reads ``slot_mapping_ptr + pid_t``, line 329, and the positions likewise, so the limit is checked);
# * q, k and v are column slices of one qkv projection, heads packed, where SGLang calls it (``GUARDED_BY_CALLER``:
#   the wrapper's ``return q_out.view(-1, qh * d)``, line 736, raises after the write for a query whose heads
#   are not packed, so the limit is checked): head stride D (rows of any stride).
FLASH = Capabilities(distinct_value_head_size=False, partial_rotary=False, head_sizes=POWERS_OF_TWO[1:],
                     block_sizes=POWERS_OF_TWO, per_head_scales=False, empty_batch=False, table_dtypes="float32",
                     padding_slot=RESERVED_SLOT, strided_index_tensors=False, unpacked_heads=False)
CAPABILITIES = {"concat_and_cache_mla": MLA, "rope_and_reshape_and_cache_flash": FLASH}
# SGLang's index tensors, contiguous by construction (sglang 0.5.23): the slots a batch writes are a prefix of
# the allocator's one int64 free list or a fresh int64 tensor, padded for a CUDA graph by torch.cat; the
# positions a fresh tensor (a torch.tensor, a kernel's output) padded the same way.
SGLANG_SLOTS = ("sglang/srt/mem_cache/allocator/token.py:61 (free_pages[:need_size], a prefix of one int64 "
                "tensor), sglang/srt/mem_cache/allocator/paged.py:241 (a fresh torch.empty) and "
                "sglang/srt/model_executor/forward_batch_info.py:1722 (out_cache_loc padded by torch.cat): "
                "contiguous")
SGLANG_POSITIONS = ("sglang/srt/model_executor/forward_batch_info.py:1216 (torch.tensor(positions)), "
                    "sglang/kernels/ops/attention/position.py:13 (torch.empty for the extend positions) and "
                    "sglang/srt/model_executor/forward_batch_info.py:1722 (padded by torch.cat): contiguous")
SGLANG_QKV = ("sglang/srt/models/gpt_oss.py:474 (q, k, v = qkv.split(...): column slices of one projection, "
              "one of the models that pass the fused argument) and sglang/srt/layers/rotary_embedding/base.py:493 "
              "(query.view(tokens, -1, qk_head_dim)): heads packed")
SGLANG_TABLE = ("sglang/srt/layers/rotary_embedding/base.py:119 (the cos/sin cache not cast to the model's dtype on "
                "HIP), :210 (_match_cos_sin_cache_dtype moves it, float32, on HIP), :477 (the fused call, taken on "
                "HIP only) and :499 (cos_sin=self.cos_sin_cache): float32")
SGLANG_SCALES = ("sglang/srt/layers/quantization/kv_cache.py:39 (layer.k_scale, one float32 element), :77 (raise "
                 "ValueError: only per-tensor scaling factors for an fp8 KV cache) and sglang/srt/models/utils.py:359 "
                 "(the fused call's k_scale is layer.k_scale): one scale per layer")
GUARDED_BY_CALLER = {"concat_and_cache_mla": {"slot_mapping layout strided": SGLANG_SLOTS},
                     "rope_and_reshape_and_cache_flash": {"slot_mapping layout strided": SGLANG_SLOTS,
                                                          "positions layout strided": SGLANG_POSITIONS,
                                                          "head stride other": SGLANG_QKV,
                                                          "table dtype input dtype": SGLANG_TABLE,
                                                          "per-head scales yes": SGLANG_SCALES}}
# SGLang's calls these stand in for: its MLA pool's write (the Triton branch SGLang takes below SM90) and its
# rotary's fused rope + cache write (``sglang-rope-cache``: the same call, views and pool, which base.py:477-507
# sends to this kernel on ROCm); every deployment of those layouts runs against them.
SERVES = {"concat_and_cache_mla": ("sglang-mla",), "rope_and_reshape_and_cache_flash": ("sglang-rope-cache",)}


def package_dir() -> pathlib.Path:
    """The ``sglang`` package directory: ``${PATH_ENV_VAR}/sglang``, else the installed one."""
    return find_package("sglang", PATH_ENV_VAR, MLA_FILE, NOT_FOUND, "sglang")


def is_arch_support_pdl() -> bool:
    """sglang/kernels/jit/utils.py ``is_arch_support_pdl``: False here (module docstring)."""
    return False


def load_kernels(package: pathlib.Path, interpreted: bool, sources: dict[str, str] | None = None) -> dict:
    """Name -> the built kernels and the wrappers (compiled from the files, their kernels handed in).

    ``sources`` maps ``MLA_FILE`` / ``FUSED_FILE`` to a replacement text (a planted kernel in the tests)."""
    sources = sources or {}
    base = {"torch": torch, "triton": triton, "tl": tl, "Optional": typing.Optional}
    mla_path, fused_path = package / MLA_FILE, package / FUSED_FILE
    built = load_jit_functions(mla_path, {name: ["triton.jit"] for name in MLA_KERNELS}, base, interpreted,
                               sources.get(MLA_FILE))
    built.update(load_jit_functions(fused_path, {name: ["triton.jit"] for name in FUSED_KERNELS}, base, interpreted,
                                    sources.get(FUSED_FILE)))
    impl = functools.partial(_set_mla_impl, kernel=built["set_mla_kv_buffer_kernel"])
    mla_scope = {**base, **built, "is_arch_support_pdl": is_arch_support_pdl, "_set_mla_kv_buffer_impl": impl}
    wrappers = load_functions(mla_path, MLA_WRAPPERS, mla_scope, sources.get(MLA_FILE))
    wrappers.update(load_functions(fused_path, (FUSED_WRAPPER,), {**base, **built}, sources.get(FUSED_FILE)))
    return {**built, **wrappers}


def _set_mla_impl(kv_buffer, loc, cache_k_nope, cache_k_rope=None, *, reserved_skip_index, dcp_world_size, dcp_rank,
                  kernel):
    """``_set_mla_kv_buffer_impl`` (mla_buffer.py:162-287; ``kernel``: the built ``set_mla_kv_buffer_kernel``) for a rope part on the Triton path: lines 217-219
    and 262-287, statement by statement (``supports_triton`` true; the JIT CUDA branch, lines 239-260, needs
    ``is_arch_support_pdl()``, False here; the no-rope branch, lines 221-237, is not the contract's)."""
    has_rope = cache_k_rope is not None and cache_k_rope.numel() > 0
    if not has_rope:
        if loc.numel() == 0:  # an empty batch takes SGLang's no-rope branch, whose launch of no program writes nothing
            return
        raise NotImplementedError("set_mla_kv_buffer_kernel_norope (no rope part) is not an operation of the contract")
    n_loc = loc.numel()
    nope_dim = cache_k_nope.shape[-1]
    rope_dim = cache_k_rope.shape[-1]
    total_dim = nope_dim + rope_dim
    block = triton.next_power_of_2(total_dim)
    grid = (n_loc, 1)
    pdl_kwargs = {"USE_GDC": True, "launch_pdl": True} if is_arch_support_pdl() else {}
    kernel[grid](
        kv_buffer, cache_k_nope, cache_k_rope, loc, reserved_skip_index, kv_buffer.stride(0), cache_k_nope.stride(0),
        cache_k_rope.stride(0), nope_dim, rope_dim, BLOCK=block, DCP_RANK=dcp_rank, DCP_WORLD_SIZE=dcp_world_size,
        **pdl_kwargs)


LANGUAGE_HELPERS = ("flip", "xor_sum", "_xor_combine")  # tl.flip and the @jit helpers it calls (Triton 3.9)


@contextlib.contextmanager
def interpreted_helpers():
    """Within: the ``@jit`` helpers of ``triton.language`` (``tl.flip`` and what it calls: ``xor_sum``,
    ``_xor_combine``) are ``InterpretedFunction`` s when Triton was imported without ``TRITON_INTERPRET=1``
    (``triton.language.standard`` then built them ``JITFunction`` s, which the interpreter cannot call from a
    kernel: "Cannot call @triton.jit'd outside of the scope of a kernel"), as with ``TRITON_INTERPRET=1`` set
    first; restored on exit."""
    import triton.experimental.gluon  # noqa: F401 (imported lazily by a launch, it wraps these as they are)

    originals = [(module, name, getattr(module, name)) for module in (tl, standard) for name in LANGUAGE_HELPERS
                 if isinstance(getattr(module, name, None), JITFunction)]
    for module, name, function in originals:
        setattr(module, name, InterpretedFunction(function.fn))
    try:
        yield
    finally:
        for module, name, function in originals:
            setattr(module, name, function)


def token_rows(cache: torch.Tensor) -> torch.Tensor:
    """``cache [NB, B, L + R]`` as SGLang's pool ``[NB * B, 1, L + R]`` (row = slot), or NotImplementedError."""
    try:
        return cache.view(cache.shape[0] * cache.shape[1], 1, cache.shape[2])
    except RuntimeError:
        raise NotImplementedError(f"SGLang's MLA pool is token rows (one stride per slot); a cache of strides "
                                  f"{tuple(cache.stride())} has no such view") from None


class SglangTritonImplementation:
    """SGLang's Triton MLA write and fused rope + flash write (module docstring)."""

    rounding = "single"  # fp32 rotation (x * cos + rotate(x) * sin), one cast on store
    padded_rows = "rotated"  # with SGLang's padding slot 0, every row's q and k are rotated
    checks_inputs = False  # the wrappers assert shapes only
    capabilities = CAPABILITIES
    serves = SERVES  # SGLang's MLA pool write and ROCm fused rope + cache write (SERVES)
    guarded_by_caller = GUARDED_BY_CALLER

    def __init__(self, sources: dict[str, str] | None = None) -> None:
        package = package_dir()
        self.interpreted = mla_fuse_kernels.INTERPRETED
        if not self.interpreted and getattr(torch.version, "hip", None):
            raise ImportError("sglang-triton maps E4M3 to torch.float8_e4m3fn; SGLang's fnuz choice on MI300 is not "
                              "mirrored")
        self.functions = load_kernels(package, self.interpreted, sources)
        backend = "Triton interpreter" if self.interpreted else "GPU"
        self.name = f"sglang-triton (mla_buffer.py, fused_qk_rope_reshape_and_cache.py, {backend})"
        self.version = package_version(package)
        self.kernel_file = str(package / MLA_FILE)

    def _run(self, function, *args, **kwargs):
        if self.interpreted:
            with corrected_interpreter(), interpreted_helpers():
                return function(*args, **kwargs)
        return function(*args, **kwargs)

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        rows = token_rows(kv_cache)
        cache_k_nope, cache_k_rope = kv_c.unsqueeze(1), k_pe.unsqueeze(1)  # [T, 1, L], [T, 1, R]
        if kv_cache_dtype.startswith("fp8"):
            if kv_cache_dtype not in E4M3_NAMES:
                raise NotImplementedError(f"kv_cache_dtype {kv_cache_dtype!r}: SGLang's fp8 MLA write stores "
                                          "fp8_dtype (E4M3) only (memory_pool.py:4991)")
            if float(scale.reshape(-1)[0]) != 1.0:  # host sync
                raise NotImplementedError("set_mla_kv_buffer_triton_fp8_quant takes no scale: scale "
                                          f"{float(scale.reshape(-1)[0])} cannot be passed")
            self._run(self.functions["set_mla_kv_buffer_triton_fp8_quant"], rows, slot_mapping, cache_k_nope,
                      cache_k_rope, FP8_DTYPE[kv_cache_dtype])
        else:
            self._run(self.functions["set_mla_kv_buffer_triton"], rows, slot_mapping, cache_k_nope, cache_k_rope)

    def rope_and_reshape_and_cache_flash(self, positions, query, key, value, key_cache, value_cache, slot_mapping,
                                         cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale):
        fp8 = kv_cache_dtype.startswith("fp8")
        if fp8 and key_cache.dtype == torch.uint8:  # get_key_buffer / get_value_buffer: view(self.dtype)
            key_cache, value_cache = key_cache.view(FP8_DTYPE[kv_cache_dtype]), value_cache.view(FP8_DTYPE[kv_cache_dtype])
        # base.py:482-507 (the 4-D NHD paged view: flash_layout=True)
        qk_head_dim = key_cache.shape[-1]
        tp_k_head_num = key_cache.shape[-2]
        key = key.view(-1, tp_k_head_num, qk_head_dim)
        tokens = key.shape[0]
        query = query.view(tokens, -1, qk_head_dim)
        extra_args = {"v": value.view(-1, value_cache.shape[-2], value_cache.shape[-1]),  # models/utils.py:358
                      "k_scale": k_scale if fp8 else None, "v_scale": v_scale if fp8 else None,
                      "key_cache": key_cache, "value_cache": value_cache, "slot_mapping": slot_mapping,
                      "swa_slot_mapping": None}
        self._run(self.functions[FUSED_WRAPPER], q=query, k=key, pos=positions, cos_sin=cos_sin_cache,
                  is_neox=is_neox, flash_layout=True, offs=None, q_out=query, k_out=key, output_zeros=False,
                  **extra_args)


__all__ = ["CAPABILITIES", "GUARDED_BY_CALLER", "PATH_ENV_VAR", "SERVES", "SglangTritonImplementation", "load_kernels",
           "package_dir"]
