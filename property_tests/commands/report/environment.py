"""What a ``mla-fuse verify`` run ran on and against: report.json's ``environment`` and
``implementation`` (docs/REPORT.md).

``environment``: the versions of Python and the libraries the suite runs with, the platform, the
device (kind, name, count, compute capability on CUDA), the CPU's model and the vector extensions
that decide which kernels run (vLLM's CPU wheel loads ``_C`` or ``_C_AVX512`` by them), and the
backend of ``mla_fuse``'s own kernels (Triton's interpreter or the GPU).
``implementation``: what the adapter is (spec, name, version, the file it came from), its
declarations, and whether each operation's signature was checked at load.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import platform
import sys

import torch

from mla_fuse_conformance.contract.implementation import distribution_of
from mla_fuse_conformance.declarations.operations import OPERATIONS, ROTATING_OPERATIONS
from mla_fuse_conformance.running.devices import select_device

# the vector extensions that decide which CPU kernels run, in /proc/cpuinfo's spelling
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")
CPUINFO = pathlib.Path("/proc/cpuinfo")


def package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu(cpuinfo: pathlib.Path = CPUINFO) -> dict:
    """``{"model", "flags"}``: the CPU's model name and which of ``VECTOR_FLAGS`` it has (from
    ``cpuinfo``; where it cannot be read, ``platform.processor()`` and no flags)."""
    fields: dict[str, str] = {}
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    except OSError:
        pass
    model = fields.get("model name") or fields.get("cpu model") or platform.processor() or None
    present = set((fields.get("flags") or fields.get("features") or "").split())
    return {"model": model, "flags": [flag for flag in VECTOR_FLAGS if flag in present]}


def device() -> dict:
    """The device the properties run on (``running.devices.select_device``), with what CUDA says of it."""
    chosen = select_device()
    if chosen.type != "cuda":
        return {"kind": chosen.type, "name": cpu()["model"], "count": 1}
    index = chosen.index or 0
    major, minor = torch.cuda.get_device_capability(index)
    return {"kind": "cuda", "name": torch.cuda.get_device_name(index), "count": torch.cuda.device_count(),
            "compute_capability": f"{major}.{minor}"}


def environment() -> dict:
    """report.json's ``environment``."""
    from mla_fuse.kernels import BACKEND  # imports Triton: after devices.triton_kernels_for_the_run() chose where

    return {"python": platform.python_version(),
            **{name: package_version(name) for name in ("torch", "triton", "hypothesis", "mla_fuse")},
            "platform": platform.platform(), "device": device(), "cpu": cpu(), "backend": BACKEND}


def describe_environment(found: dict) -> list[str]:
    """The lines of the printed report that say what ran where."""
    where = found["device"]
    capability = f", compute capability {where['compute_capability']}" if "compute_capability" in where else ""
    versions = ", ".join(f"{name} {found[name]}" for name in ("python", "torch", "triton", "hypothesis", "mla_fuse"))
    backend = "Triton's interpreter" if found["backend"] == "interpreter" else "the GPU"
    adapter = f"; an adapter's @triton.jit kernels on {found['adapter_triton_kernels']}" \
        if found.get("adapter_triton_kernels") else ""
    return [f"device: {where['kind']} x{where['count']} ({where['name']}{capability}); mla_fuse kernels on {backend}"
            + adapter,
            f"versions: {versions}; {found['platform']}",
            f"CPU: {found['cpu']['model']}; vector flags: {' '.join(found['cpu']['flags']) or 'none found'}"]


def adapter_module(impl):
    """The module the adapter's object comes from (its class's module for an instance)."""
    target = impl.target
    name = getattr(target, "__module__", None) or type(target).__module__
    return sys.modules.get(name)


def implementation_version(impl) -> str | None:
    """The adapter's ``version`` attribute, else the version of the distribution its top-level
    module belongs to, else None."""
    declared = getattr(impl.target, "version", None)
    if isinstance(declared, str) and declared:
        return declared
    module = adapter_module(impl)
    if module is None:
        return None
    found = distribution_of(module.__name__.partition(".")[0])
    return found[1] if found else None


def implementation(impl, declarations: list[str]) -> dict:
    """report.json's ``implementation``: ``declarations`` are the lines ``verify`` printed for it."""
    module = adapter_module(impl)
    path = getattr(module, "__file__", None) if module is not None else None
    return {"spec": impl.spec, "name": impl.name, "version": implementation_version(impl),
            "module_path": str(pathlib.Path(path).absolute()) if path else None,
            "declaration": declaration(impl, declarations),
            "signatures": {op: "not readable" if op in impl.unchecked else "checked" for op in impl.operations}}


def declaration(impl, lines: list[str]) -> dict:
    return {"rounding": impl.rounding, "padded_rows": impl.padded_rows, "checks_inputs": impl.checks_inputs,
            "required": list(impl.required), "provides": list(impl.operations),
            "missing": [op for op in OPERATIONS if not impl.provides(op)],
            "capabilities": {op: impl.caps(op).describe(op in ROTATING_OPERATIONS) for op in impl.operations},
            "lines": lines}
