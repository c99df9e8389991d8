"""Liger-Kernel's Triton rope as an implementation of the contract (``--impl liger``).

Liger-Kernel (``liger_kernel``, LinkedIn's Triton kernels for training; written against 0.8.5, ``version``
says which one ran) ships one operation of CONTRACT §4: ``rotary_embedding``, the kernel ``_triton_rope`` of
``liger_kernel/ops/rope.py`` launched by its wrapper ``rope_forward`` (what ``LigerRopeFunction.forward`` and
``liger_rotary_pos_emb`` run). Its interface is Hugging Face's: ``q [B, H, S, D]`` and ``k [B, Hkv, S, D]``
(transposed views of ``[B, S, H, D]`` storage), NeoX pairing (Llama/Mistral), partial rotary through
``rotary_dim``, and cos/sin *rows* ``[S, rotary_dim]`` (or batched) rather than positions: the kernel reads
row ``pid % seq_len``. It computes in the table's dtype (``tl.load(q).to(sin_row.dtype)``) and rotates the
contiguous ``[B, S, H, D]`` tensor in place, or a copy when ``q.transpose(1, 2)`` is not contiguous (the
wrapper's ``.contiguous()``), returning the rotated tensors either way.

Finding the package (``package_dir``): ``$MLA_FUSE_LIGER_PATH``, a directory holding ``liger_kernel/`` (an
unpacked wheel: ``unzip liger_kernel-0.8.5-py3-none-any.whl -d DIR``), else the installed package
(``importlib.util.find_spec``, which does not import it). Its version is read from the
``liger_kernel-*.dist-info`` beside it.

Loading (``load_rope``), a decision: nothing of Liger is imported. ``import liger_kernel.ops.rope`` does
work without a GPU, but it runs ``liger_kernel/__init__`` and ``liger_kernel/ops/__init__`` (the backend
dispatcher, ``infer_device()`` and ``LIGER_KERNEL_IMPL``, which may replace operators for the device found),
imports some fifty modules, and its ``@triton.jit`` builds the kernel for the backend ``TRITON_INTERPRET``
named at import time, not the one ``mla_fuse.kernels`` chose. ``rope.py`` itself needs only ``torch``,
``triton`` and ``tl``, so it is read instead (``running/foreign_kernels.py``): ``_triton_rope`` (decorated
exactly ``@triton.jit``) is compiled alone under the file's name and line numbers and built for our backend
(``InterpretedFunction`` or ``JITFunction``; no setting of the process changes), and the wrapper
``rope_forward`` with its helper ``_resolve_rotary_dim`` is compiled from the same file and run as written,
with that kernel as its ``_triton_rope``.

Under the interpreter, each call runs in ``corrected_interpreter``: Liger computes in the table's dtype, so
with a bfloat16 table the rotation is bfloat16 arithmetic, which the interpreter runs on the bit patterns,
and with an fp32 table the store narrows fp32 to bfloat16, which the interpreter truncates; the context
makes both what a GPU does (round to nearest even). On a GPU nothing is replaced.

The glue (``rotary_embedding``), and the contract clauses it bypasses, so a kernel bug there cannot be seen:

* **positions**: Liger takes cos/sin rows, not positions, so the adapter gathers them itself,
  ``cos_sin_cache[positions]``, and passes the halves as ``cos [T, R/2]``, ``sin [T, R/2]`` with
  ``rotary_dim=R`` (Liger's documented form for tables that are not duplicated). The contract's position
  handling (index dtypes, strided positions, rows of the table) is torch's indexing here, not Liger's kernel;
  the kernel's own row choice is exercised with one batch (row ``pid % T`` = ``pid``).
* **layout**: the contract's ``[T, H, D]`` (or ``[T, H * D]``) is passed as Hugging Face's ``[1, H, T, D]``
  (``view(T, H, D).unsqueeze(0).transpose(1, 2)``), whose transpose back is the caller's storage.
* **in place**: the wrapper returns the rotated tensors; where they are a copy (a query or key whose token
  stride is not ``H * D``), the adapter copies them back into the caller's tensor, bit for bit.
* **is_neox=False** raises ``ValueError`` (Liger has no GPT-J pairing; declared, below).

Declared: ``rounding = "per_op"`` (CONTRACT §1: arithmetic in the table's dtype rounds after every
operation when the table is bfloat16 or float16; with an fp32 table it is fp32 products and sum, one
rounding, inside the wider bound); limits (``CAPABILITIES``), each what Liger's code or docs say it does not do.
"""

from __future__ import annotations

import pathlib

import torch
import triton
import triton.language as tl

from mla_fuse import kernels as mla_fuse_kernels  # not `kernels`: this adapter's kernels are the third party's

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.running.foreign_kernels import (find_package, load_functions, load_jit_functions,
                                                          package_version)
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

PATH_ENV_VAR = "MLA_FUSE_LIGER_PATH"
NOT_FOUND = (f"Liger-Kernel is not found: set {PATH_ENV_VAR} to a directory holding liger_kernel/ (`pip download "
             "--no-deps liger-kernel==0.8.5` and unzip the wheel into it), or install it (`pip install --no-deps "
             "liger-kernel`); only liger_kernel/ops/rope.py is read, nothing of it is imported")
ROPE_FILE = "ops/rope.py"
KERNEL_NAME = "_triton_rope"
WRAPPER_NAMES = ("rope_forward", "_resolve_rotary_dim")

CAPABILITIES = {
    # LigerRopeFunction: "implements the HuggingFace Llama & Mistral version" (halves: NeoX pairing only);
    # rope_forward(q, k, ...) transposes and launches on both: key is required.
    "rotary_embedding": Capabilities(styles=("neox",), key_optional=False),
}


def package_dir() -> pathlib.Path:
    """The ``liger_kernel`` package directory: ``${PATH_ENV_VAR}/liger_kernel``, else the installed one."""
    return find_package("liger_kernel", PATH_ENV_VAR, ROPE_FILE, NOT_FOUND, "liger-kernel")


def load_rope(package: pathlib.Path, interpreted: bool, source: str | None = None):
    """Liger's ``rope_forward``, run as written with ``_triton_rope`` built for the backend (module
    docstring). ``source`` replaces ``rope.py``'s text (a planted kernel in the tests)."""
    path = package / ROPE_FILE
    kernel = load_jit_functions(path, {KERNEL_NAME: ["triton.jit"]}, {"triton": triton, "tl": tl}, interpreted,
                                source)[KERNEL_NAME]
    return load_functions(path, WRAPPER_NAMES, {"torch": torch, "triton": triton, KERNEL_NAME: kernel},
                          source)["rope_forward"]


class LigerImplementation:
    """Liger-Kernel's rope (module docstring)."""

    rounding = "per_op"  # arithmetic in the table's dtype: bf16/fp16 tables round after every operation
    padded_rows = "rotated"  # no fused operation: rope has no slot mapping
    checks_inputs = False  # _resolve_rotary_dim's ValueErrors only, not the contract's checks
    exact_bf16 = True  # under the interpreter, bfloat16 conversions and arithmetic as on a GPU
    capabilities = CAPABILITIES

    def __init__(self, source: str | None = None) -> None:
        package = package_dir()
        self.interpreted = mla_fuse_kernels.INTERPRETED
        self.rope_forward = load_rope(package, self.interpreted, source)
        backend = "Triton interpreter, exact bf16" if self.interpreted else "GPU"
        self.name = f"liger (liger_kernel/{ROPE_FILE} {KERNEL_NAME}, {backend})"
        self.version = package_version(package)
        self.kernel_file = str(package / ROPE_FILE)

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        """``rope_forward`` on Hugging Face views of ``query`` and ``key`` with the rows of ``positions``
        (the glue of the module docstring)."""
        if not is_neox:
            raise ValueError("is_neox=False: Liger-Kernel's rope pairs halves (NeoX) only")
        rotary_dim = cos_sin_cache.shape[-1]
        positions = positions.flatten()
        tokens = positions.shape[0]
        query = query.view(tokens, query.shape[1] // head_size if query.dim() == 2 else query.shape[1], head_size)
        key = key.view(tokens, key.shape[1] // head_size if key.dim() == 2 else key.shape[1], head_size)
        rows = cos_sin_cache[positions]  # bypass: positions are gathered here, not by the kernel
        cos, sin = rows[:, :rotary_dim // 2], rows[:, rotary_dim // 2:]
        hf_query, hf_key = query.unsqueeze(0).transpose(1, 2), key.unsqueeze(0).transpose(1, 2)
        with corrected_interpreter() if self.exact_bf16 else uncorrected_interpreter():
            rotated = self.rope_forward(hf_query, hf_key, cos, sin, rotary_dim=rotary_dim)[:2]
        for target, out in zip((query, key), rotated):
            out = out.transpose(1, 2)[0]
            if out.data_ptr() != target.data_ptr() or out.stride() != target.stride():
                target.copy_(out)  # the wrapper rotated a contiguous copy: back into the caller's tensor


__all__ = ["CAPABILITIES", "LigerImplementation", "PATH_ENV_VAR", "load_rope", "package_dir"]
