"""Triton kernels of mla_fuse, one per file, plus shared ``@triton.jit`` helpers.

Backend selection happens here, before any kernel module is imported (Triton
decides at decoration time whether ``@triton.jit`` builds a GPU kernel or an
interpreted one): without a CUDA device ``TRITON_INTERPRET=1`` is set, so the
kernels run on CPU tensors through Triton's interpreter. An explicit
``TRITON_INTERPRET`` in the environment is always respected (``0`` is how the
ahead-of-time compile test builds GPU kernels on a machine without a GPU).

The kernels never rely on Triton's float down-casts (the interpreter's are
wrong, triton-lang/triton#8322): every rounding to bf16/fp16/fp8 is integer
arithmetic on the fp32 bit pattern (``conversions.py``), exact on every backend.
"""

from __future__ import annotations

import os

import torch

INTERPRET_ENV_VAR = "TRITON_INTERPRET"

if INTERPRET_ENV_VAR not in os.environ and not torch.cuda.is_available():
    os.environ[INTERPRET_ENV_VAR] = "1"

import triton  # noqa: E402  (after the backend choice, before any @triton.jit)

#: Whether the kernels of this process are interpreted (fixed when they were decorated).
INTERPRETED: bool = bool(triton.knobs.runtime.interpret)

__all__ = ["INTERPRETED", "INTERPRET_ENV_VAR"]
