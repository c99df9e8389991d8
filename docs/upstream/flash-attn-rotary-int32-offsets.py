"""flash-attn: apply_rotary's kernel computes row addresses in int32; rows 2^31 elements or more past x wrap.

Standalone: needs torch, triton and flash-attn's flash_attn/ops/triton/rotary.py (an installed flash-attn or
the unpacked sdist; the file imports only torch and triton, so it is loaded by path and nothing else of
flash-attn is imported). Without a GPU the kernel runs under Triton's interpreter (TRITON_INTERPRET=1).

    python flash-attn-rotary-int32-offsets.py [--file PATH/flash_attn/ops/triton/rotary.py] [--reference]

Case: x (3, 1, 1, 8) float16 as flash-attn's decode step passes it (batch 3, seqlen 1, one head of 8),
seqlen_offsets = tensor([0, 1, 2]), cos/sin of 4 rows, inplace=True, NeoX pairing. x is a view whose
batch stride is 2^30 + 1 elements (rows of a larger buffer): row 2 starts 2^31 + 2 elements past x. That
stride fits in int32, so Triton passes it as an i32 and ``rotary_kernel`` line 51 ``X = X + pid_batch *
stride_x_batch`` multiplies two i32: for pid_batch 2 the product wraps to -2^31 + 2. Row 2 is read and
written 2^31 elements before x instead. The buffer holds 2^31 elements before x as well, so the wrapped
write lands inside it (no crash; 8 GiB of address space, only the pages touched are allocated) and is
seen: row 2 is not rotated, and 8 elements 2^31 before it changed.

Exit 1: row 2 not rotated, or memory outside the rows changed (the defect). Exit 0: all three rows rotated
as torch rotates them and nothing else written. Exit 2: the kernel file is missing, the 8 GiB buffer cannot be
had, or the call raised. --reference rotates
with torch in place of the kernel, to show the check passes. float16 throughout: the interpreter's float16
arithmetic is numpy's, correctly rounded, so the interpreter adds no error of its own to this case.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pathlib
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton reads it
import triton  # noqa: E402,F401

RELATIVE = "ops/triton/rotary.py"
STRIDE = 2 ** 30 + 1  # fits in int32; 2 * STRIDE does not
SENTINEL = -7.0


def kernel_file(given: str | None) -> pathlib.Path | None:
    if given:
        return pathlib.Path(given)
    spec = importlib.util.find_spec("flash_attn")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / RELATIVE


class _CpuTorch:
    """torch with ``cuda.device(index)`` a context that does nothing: apply_rotary's ``with
    torch.cuda.device(x.device.index)`` raises TypeError for a CPU tensor (index None)."""

    class cuda:
        @staticmethod
        def device(index):
            return contextlib.nullcontext()

    def __getattr__(self, name):
        return getattr(torch, name)


def load_apply_rotary(path: pathlib.Path):
    """flash-attn's ``apply_rotary``, from its file alone (it imports only torch and triton)."""
    spec = importlib.util.spec_from_file_location("flash_attn_triton_rotary", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not torch.cuda.is_available():
        module.torch = _CpuTorch()  # the wrapper's only use of CUDA: selecting x's device
    return module.apply_rotary


def rotate_reference(x, cos, sin, positions):
    """NeoX rotation of x (batch, 1, heads, 8) in float32, rounded once to x's dtype, in place."""
    half = cos.shape[1]
    for b, p in enumerate(positions.tolist()):
        a, c = x[b, 0, :, :half].float(), x[b, 0, :, half:2 * half].float()
        co, si = cos[p].float(), sin[p].float()
        x[b, 0, :, :half], x[b, 0, :, half:2 * half] = a * co - c * si, a * si + c * co


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", help="flash_attn/ops/triton/rotary.py (default: the installed flash_attn's)")
    parser.add_argument("--reference", action="store_true", help="rotate with torch instead of the kernel")
    args = parser.parse_args()
    path = kernel_file(args.file)
    if path is None or not path.is_file():
        print(f"no kernel file: {path} (give --file PATH/flash_attn/{RELATIVE})")
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = 2 ** 31  # x starts this many elements into the buffer: a wrapped row address stays inside it
    try:
        # untouched pages are not allocated: a few MiB of the 8 GiB are
        buffer = torch.empty(base + 2 * STRIDE + 8, dtype=torch.float16, device=device)
    except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
        print(f"no 8 GiB buffer here: {error}")
        return 2
    x = torch.as_strided(buffer, (3, 1, 1, 8), (STRIDE, 8, 8, 1), base)
    wrapped = buffer[base + 2 * STRIDE - 2 ** 32: base + 2 * STRIDE - 2 ** 32 + 8]  # row 2's address, wrapped
    wrapped.fill_(SENTINEL)
    values = torch.arange(1, 25, dtype=torch.float16, device=device).view(3, 1, 1, 8) / 8
    x.copy_(values)
    angles = torch.arange(4, dtype=torch.float32, device=device)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001],
                                                                                        device=device)
    cos, sin = angles.cos().half(), angles.sin().half()
    positions = torch.tensor([0, 1, 2], device=device)
    want = values.clone()
    rotate_reference(want, cos, sin, positions)
    if args.reference:
        rotate_reference(x, cos, sin, positions)
    else:
        try:
            load_apply_rotary(path)(x, cos, sin, seqlen_offsets=positions, interleaved=False, inplace=True)
        except Exception as error:  # noqa: BLE001 - any other failure is not this defect
            print(f"the call raised {type(error).__name__}: {error}")
            return 2
    rows = [torch.equal(x[b], want[b]) for b in range(3)]
    untouched = bool((wrapped == SENTINEL).all())
    print(f"rows rotated as torch rotates them: {rows}; the 8 elements 2^31 before row 2 untouched: {untouched}")
    if all(rows) and untouched:
        print("OK: every row rotated at its own address")
        return 0
    print(f"DEFECT: row 2, 2^31 + 2 elements past x, was read and written at offset {2 * STRIDE - 2 ** 32} "
          "(pid_batch * stride_x_batch in int32, rotary.py: X = X + pid_batch * stride_x_batch)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
