"""flash-attn's Triton rotary as an implementation of the contract (``--impl flash-attn-rotary``).

flash-attn (``flash-attn``, Tri Dao's; written against the 2.8.3.post2 sdist, ``version`` says which one ran)
ships one operation of CONTRACT §4: ``rotary_embedding``, the kernel ``rotary_kernel`` of
``flash_attn/ops/triton/rotary.py`` launched by its wrapper ``apply_rotary`` (the file vLLM vendors as
``vllm/vllm_flash_attn/ops/triton/rotary.py``). Its interface: ``x (batch, seqlen, nheads, headdim)``, tables
``cos`` and ``sin`` of ``(seqlen_ro, rotary_dim / 2)``, ``seqlen_offsets`` an int or an int32/int64 tensor
of ``(batch,)`` (each sequence's first row of the tables), ``interleaved`` (GPT-J pairing) and ``inplace``.
It loads x and the tables as fp32, computes in fp32 and stores once (``rounding = "single"``); table rows at
or past ``seqlen_ro`` are read as ``cos = 1, sin = 0`` (``mask_cs``).

The engine call judged, with per-token positions: flash-attn's own inference path, ``MHA.forward`` of
``flash_attn/modules/mha.py`` (the model classes of ``flash_attn/models/`` and ``flash_attn/utils/
generation.py`` decode through it). Lines of the 2.8.3.post2 sdist:

* ``mha.py:621-629``: ``seqlen_offset = inference_params.lengths_per_sample`` (an int32 tensor ``(batch,)``,
  ``generation.py:663``: each sequence's length, the position of its next token), and ``mha.py:631``
  ``rotary_max_seqlen = inference_params.max_seqlen``;
* ``mha.py:682-691`` (GQA/MQA: ``q`` and ``kv`` views of one projection, ``mha.py:670-674``): ``q, kv =
  self.rotary_emb(q, kv, seqlen_offset=seqlen_offset, max_seqlen=rotary_max_seqlen)`` with ``q (batch,
  seqlen, H, D)``, taken in a decode step where flash-attn's own CUDA ``flash_attn_with_kvcache`` does not
  rotate (``not self.use_flash_attn``, or a rotary width not a multiple of 16): ``seqlen`` is 1, one token
  per sequence, so x is ``(T, 1, H, D)`` and ``seqlen_offsets`` the tokens' positions;
* ``flash_attn/layers/rotary.py:450-451``: the tables ``_cos_cached``/``_sin_cached`` of ``max_seqlen`` rows
  (``rotary.py:413-416``: ``torch.cos(outer(t, inv_freq)).to(dtype)``, the model's dtype), then
  ``rotary.py:466-481``: ``apply_rotary_emb_func(q, cos, sin, interleaved=self.interleaved, inplace=True,
  seqlen_offsets=seqlen_offset)`` (``ApplyRotaryEmb.forward``, ``rotary.py:40-60``: ``apply_rotary(x, cos,
  sin, seqlen_offsets=..., cu_seqlens=None, max_seqlen=None, interleaved=..., inplace=True)``) and
  ``apply_rotary_emb_kv_(kv, ...)`` (``ApplyRotaryEmbKV_.forward``, ``rotary.py:270-276``: ``k = kv[:, :, 0]``,
  ``apply_rotary(k, cos, sin, seqlen_offsets=..., interleaved=..., inplace=True)``).

vLLM calls the same file otherwise (``ApplyRotaryEmb.forward_cuda`` of its rotary_embedding/common.py,
its vision towers): x ``(1, T, H, D)`` with cos/sin rows already gathered per token and offsets 0, so there
the kernel's own row choice is not exercised; the form above is the one that takes positions.

The mapping of the contract's case (``rotary_embedding``) onto that call:

* ``positions [T]`` -> ``seqlen_offsets`` (flattened; int32 or int64 as given: ``apply_rotary`` asserts one
  of the two and makes it contiguous, ``ops/triton/rotary.py:142-145``), batch ``T``, seqlen 1;
* ``query [T, H*D]`` or ``[T, H, D]`` -> ``query.view(T, H, D).unsqueeze(1)``: the caller's storage, in
  place (the kernel honours every stride), as ``q`` is a view of the projection in ``mha.py:671-673``;
  ``key`` likewise (``kv[:, :, 0]`` is a strided view there too); ``key=None``: one call, query only;
* ``cos_sin_cache [P, R]`` -> ``cos = cos_sin_cache[:, :R/2]``, ``sin = cos_sin_cache[:, R/2:]``, the two
  tables of ``seqlen_ro = P`` rows that flash-attn keeps apart (``apply_rotary`` makes each contiguous,
  ``ops/triton/rotary.py:141``); the table's dtype as given (flash-attn builds it in the model's dtype; the
  kernel widens any to fp32, ``ops/triton/rotary.py:73-74``);
* ``is_neox`` -> ``interleaved = not is_neox`` (``RotaryEmbedding(interleaved=...)``, ``rotary.py:353-359``:
  "rotate pairs of even and odd dimensions (GPT-J style) instead of 1st half and 2nd half (GPT-NeoX
  style)");
* partial rotary ``R < D``: ``rotary_dim = 2 * cos.shape[1]``, the tail untouched in place.

Nothing of the contract is bypassed: positions, strides, pairing and partial rotary are the kernel's.

Finding the package (``package_dir``): ``$MLA_FUSE_FLASH_ATTN_PATH``, a directory holding ``flash_attn/`` (the
unpacked sdist: ``tar xzf flash_attn-2.8.3.post2.tar.gz`` gives ``flash_attn-2.8.3.post2/``), else the
installed package (``find_spec``, which imports nothing). Its version: the ``flash_attn.egg-info`` (sdist) or
dist-info beside it. Loading (``load_apply_rotary``): nothing of flash-attn is imported (``import flash_attn``
imports its CUDA extension, ``flash_attn_2_cuda``, which an sdist does not have): ``rotary_kernel`` (decorated
exactly ``@triton.jit``) is compiled alone from the file and built for the backend ``mla_fuse.kernels`` chose,
and ``apply_rotary`` is compiled from the same file and run as written with that kernel
(``running/foreign_kernels.py``). Its ``torch.library.wrap_triton`` returns the kernel itself outside tracing
and under the interpreter. Its ``with torch.cuda.device(x.device.index)`` (``ops/triton/rotary.py:158``, which
picks the tensor's GPU) raises for a CPU tensor (``TypeError``: the index is None), so under the interpreter
the wrapper's ``torch`` is torch with ``cuda.device`` a context that does nothing (``_torch_for_the_cpu``);
every other statement is run as written, and on a GPU the wrapper sees torch itself.

Under the interpreter each call runs in ``corrected_interpreter`` (``running/interpreter_corrections.py``):
the kernel widens bfloat16 x and tables to fp32 (the interpreter flushes bfloat16 subnormals) and stores fp32
into bfloat16 (the interpreter truncates); the context makes both what a GPU does. On a GPU nothing is
replaced.

Declared (``CAPABILITIES``), each what ``apply_rotary`` asserts (``flash_attn/ops/triton/rotary.py``):
``headdim <= 256`` (line 138: "Only support headdim <= 256"): head sizes 2 to 256. The other asserts hold for
every case of the contract: ``sin.shape == cos.shape`` (135), ``rotary_dim <= headdim`` (137, CONTRACT §1's
R <= D), ``seqlen_ro >= seqlen`` (139: seqlen is 1), ``seqlen_offsets.shape == (batch,)`` and its dtype int32
or int64 (143-144, CONTRACT §2's index dtypes).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import pathlib
from typing import Optional, Union

import torch
import triton
import triton.language as tl

from mla_fuse import kernels as mla_fuse_kernels  # not `kernels`: this adapter's kernels are the third party's

from mla_fuse_conformance.contract.capabilities import Capabilities
from mla_fuse_conformance.running.foreign_kernels import find_package, load_functions, load_jit_functions
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

PATH_ENV_VAR = "MLA_FUSE_FLASH_ATTN_PATH"
NOT_FOUND = (f"flash-attn is not found: set {PATH_ENV_VAR} to a directory holding flash_attn/ (the sdist "
             "flash_attn-2.8.3.post2.tar.gz unpacked: its flash_attn-2.8.3.post2/ directory), or install it; only "
             "flash_attn/ops/triton/rotary.py is read, nothing of it is imported")
ROTARY_FILE = "ops/triton/rotary.py"
KERNEL_NAME = "rotary_kernel"
WRAPPER_NAME = "apply_rotary"
MAX_HEAD_SIZE = 256  # ops/triton/rotary.py:138, assert headdim <= 256

CAPABILITIES = {
    "rotary_embedding": Capabilities(head_sizes=tuple(range(2, MAX_HEAD_SIZE + 1))),
}


def package_dir() -> pathlib.Path:
    """The ``flash_attn`` package directory: ``${PATH_ENV_VAR}/flash_attn``, else the installed one."""
    return find_package("flash_attn", PATH_ENV_VAR, ROTARY_FILE, NOT_FOUND, "flash-attn sdist")


def package_version(package: pathlib.Path) -> str | None:
    """``"flash_attn 2.8.3.post2"`` from the egg-info (sdist) or dist-info beside ``package``, or None (the
    sdist's top_level.txt also names ``hopper``, so the shared helper's one-name match does not apply)."""
    for distribution in importlib.metadata.distributions(path=[str(package.parent)]):
        if package.name in (distribution.read_text("top_level.txt") or "").split():
            return f"{distribution.metadata['Name']} {distribution.version}"
    return None


class _CpuCuda:
    """``torch.cuda`` with ``device(index)`` a context that does nothing (tensors on the CPU)."""

    @staticmethod
    def device(index):
        return contextlib.nullcontext()

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _torch_for_the_cpu:
    """``torch`` as ``apply_rotary`` sees it under the interpreter: ``cuda`` is ``_CpuCuda``."""

    cuda = _CpuCuda()

    def __getattr__(self, name):
        return getattr(torch, name)


def load_apply_rotary(package: pathlib.Path, interpreted: bool, source: str | None = None):
    """flash-attn's ``apply_rotary``, run as written with ``rotary_kernel`` built for the backend (module
    docstring). ``source`` replaces ``rotary.py``'s text (a planted kernel in the tests)."""
    path = package / ROTARY_FILE
    kernel = load_jit_functions(path, {KERNEL_NAME: ["triton.jit"]}, {"triton": triton, "tl": tl}, interpreted,
                                source)[KERNEL_NAME]
    namespace = {"torch": _torch_for_the_cpu() if interpreted else torch, "triton": triton, "Optional": Optional,
                 "Union": Union, KERNEL_NAME: kernel}
    return load_functions(path, (WRAPPER_NAME,), namespace, source)[WRAPPER_NAME]


def engine_form(positions, x, heads: int, head_size: int):
    """``x`` of the contract (``[T, H*D]`` or ``[T, H, D]``) as flash-attn's decode step passes it,
    ``(T, 1, H, D)``, a view of the same storage, and the positions as ``seqlen_offsets`` (``(T,)``)."""
    positions = positions.flatten()
    return positions, x.view(positions.shape[0], heads, head_size).unsqueeze(1)


class FlashAttnRotaryImplementation:
    """flash-attn's Triton rotary (module docstring)."""

    rounding = "single"  # x and tables widened to fp32, fp32 arithmetic, one rounding on store
    padded_rows = "rotated"  # no fused operation: rope has no slot mapping
    checks_inputs = False  # apply_rotary's asserts only, not the contract's checks
    exact_bf16 = True  # under the interpreter, bfloat16 conversions as on a GPU
    capabilities = CAPABILITIES

    def __init__(self, source: str | None = None) -> None:
        package = package_dir()
        self.interpreted = mla_fuse_kernels.INTERPRETED
        self.apply_rotary = load_apply_rotary(package, self.interpreted, source)
        backend = "Triton interpreter, exact bf16" if self.interpreted else "GPU"
        self.name = f"flash-attn-rotary (flash_attn/{ROTARY_FILE} {KERNEL_NAME}, {backend})"
        self.version = package_version(package)
        self.kernel_file = str(package / ROTARY_FILE)

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        """``apply_rotary`` on ``query`` then ``key`` as ``MHA.forward``'s decode step calls it (module
        docstring: the mapping)."""
        half = cos_sin_cache.shape[-1] // 2
        cos, sin = cos_sin_cache[:, :half], cos_sin_cache[:, half:]
        for x in (query, key):
            if x is None:
                continue
            heads = x.shape[1] // head_size if x.dim() == 2 else x.shape[1]
            seqlen_offsets, x = engine_form(positions, x, heads, head_size)
            with corrected_interpreter() if self.exact_bf16 else uncorrected_interpreter():
                self.apply_rotary(x, cos, sin, seqlen_offsets=seqlen_offsets, interleaved=not is_neox, inplace=True)


__all__ = ["CAPABILITIES", "FlashAttnRotaryImplementation", "PATH_ENV_VAR", "engine_form", "load_apply_rotary",
           "package_dir"]
