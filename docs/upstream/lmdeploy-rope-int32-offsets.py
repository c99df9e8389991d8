"""LMDeploy: apply_rotary_pos_emb's kernel computes token addresses in int32; rows 2^31 elements or more past q wrap.

Standalone: needs torch, triton and LMDeploy's file lmdeploy/pytorch/kernels/cuda/apply_rotary_pos_emb.py (an
installed lmdeploy, or an unpacked wheel: --path DIR, the directory holding lmdeploy/). The file imports only
torch and triton, so it is loaded by path and nothing else of LMDeploy is imported. Without a GPU the kernel
runs under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).

    python lmdeploy-rope-int32-offsets.py [--path DIR] [--reference]

Case: q (3, 1, 8) float16 as LMDeploy's models pass it (3 tokens, one head of 8), k (3, 1, 8), cos/sin (3, 8)
(rotate_half, each half repeated), ``q_embed=q, k_embed=k`` (``TritonApplyRotaryEmbImpl`` with
``inplace=True``). q is a view whose token stride is 2^30 + 1 elements (rows of a larger buffer): row 2
starts 2^31 + 2 elements past q. The kernel takes that stride as ``stride_qs: tl.constexpr`` (line 33), which
Triton makes an i32 constant, and line 87 ``q_ptr = Q + pos_offset * stride_qs`` multiplies it by the int32
``pos_offset``: for token 2 the product wraps to -2^31 + 2. Row 2 is read and written 2^31 elements before q
instead. The buffer holds 2^31 elements before q as well, so the wrapped write lands inside it (no crash; 8
GiB of address space, only the pages touched are allocated) and is seen: row 2 is not rotated, and 8
elements 2^31 before it changed.

Exit 1: row 2 not rotated, or memory outside the rows changed (the defect). Exit 0: all three rows rotated as
torch rotates them and nothing else written. Exit 2: the kernel file is missing, the 8 GiB buffer cannot be
had, or the call raised. --reference rotates with torch in place of the kernel, to show the check passes.
Compared within one unit in the last place of float16 (the kernel rounds cos/sin and each product to
float16).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton reads it
import triton  # noqa: E402

RELATIVE = "pytorch/kernels/cuda/apply_rotary_pos_emb.py"
STRIDE = 2 ** 30 + 1  # fits in int32; 2 * STRIDE does not
SENTINEL = -7.0


def kernel_file(given: str | None) -> pathlib.Path | None:
    if given:
        return pathlib.Path(given) / "lmdeploy" / RELATIVE
    spec = importlib.util.find_spec("lmdeploy")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / RELATIVE


def load_apply_rotary_pos_emb(path: pathlib.Path):
    """LMDeploy's ``apply_rotary_pos_emb``, from its file alone (it imports only torch and triton)."""
    spec = importlib.util.spec_from_file_location("lmdeploy_apply_rotary_pos_emb", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.apply_rotary_pos_emb


def rotate_reference(x, cos, sin):
    """rotate_half rotation of x (tokens, heads, 8) in float32, rounded once to x's dtype, in place."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :half].float(), sin[:, None, :half].float()
    x[..., :half], x[..., half:] = a * c - b * s, b * c + a * s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default=os.environ.get("LMDEPLOY_PATH"), help="a directory holding lmdeploy/")
    parser.add_argument("--reference", action="store_true", help="rotate with torch instead of the kernel")
    args = parser.parse_args()
    path = kernel_file(args.path)
    if path is None or not path.is_file():
        print(f"no kernel file ({path}): pass --path DIR (an unpacked lmdeploy wheel)")
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{path}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{'GPU' if device == 'cuda' else 'Triton interpreter (no GPU)'}")
    base = 2 ** 31  # q starts this many elements into the buffer: a wrapped row address stays inside it
    try:
        buffer = torch.empty(base + 2 * STRIDE + 8, dtype=torch.float16, device=device)  # pages touched only
    except (RuntimeError, MemoryError) as error:  # torch.OutOfMemoryError is a RuntimeError
        print(f"no 8 GiB buffer here: {error}")
        return 2
    q = torch.as_strided(buffer, (3, 1, 8), (STRIDE, 8, 1), base)
    wrapped = buffer[base + 2 * STRIDE - 2 ** 32: base + 2 * STRIDE - 2 ** 32 + 8]  # row 2's address, wrapped
    wrapped.fill_(SENTINEL)
    values = torch.arange(1, 25, dtype=torch.float16, device=device).view(3, 1, 8) / 8
    q.copy_(values)
    k = values.clone()
    angles = torch.arange(3, dtype=torch.float32, device=device)[:, None] * torch.tensor([1.0, 0.1, 0.01, 0.001],
                                                                                        device=device)
    cos, sin = angles.cos().repeat(1, 2).half(), angles.sin().repeat(1, 2).half()  # [3, 8]: positions 0, 1, 2
    want = values.clone()
    rotate_reference(want, cos, sin)
    if args.reference:
        rotate_reference(q, cos, sin)
    else:
        try:
            load_apply_rotary_pos_emb(path)(q, k, cos, sin, q_embed=q, k_embed=k)
        except Exception as error:  # noqa: BLE001 - any other failure is not this defect
            print(f"the call raised {type(error).__name__}: {error}")
            return 2
    ulp = torch.finfo(torch.float16).eps * want.float().abs().clamp(min=2 ** -14)
    rows = [bool(((q[t].float() - want[t].float()).abs() <= ulp[t]).all()) for t in range(3)]
    untouched = bool((wrapped == SENTINEL).all())
    print(f"rows rotated as torch rotates them: {rows}; the 8 elements 2^31 before row 2 untouched: {untouched}")
    if all(rows) and untouched:
        print("OK: every row rotated at its own address")
        return 0
    print(f"DEFECT: row 2, 2^31 + 2 elements past q, was read and written at offset {2 * STRIDE - 2 ** 32} "
          "(apply_rotary_pos_emb.py line 87: q_ptr = Q + pos_offset * stride_qs, in int32)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
