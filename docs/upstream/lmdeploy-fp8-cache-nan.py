"""LMDeploy: the per-tensor fp8 KV-cache write stores a NaN key or value as the largest finite code, +-448.

Standalone: needs torch, triton and LMDeploy's file lmdeploy/pytorch/kernels/cuda/fill_kv_cache.py (an installed
lmdeploy, or an unpacked wheel: --path DIR, the directory holding lmdeploy/). The file imports LMDeploy's
``messages`` (and so its engine), so only the kernel ``_fill_kv_cache_fp8_scalar_kernel`` is compiled from it
(``ast``, under the file's own name and line numbers) and launched with the arguments ``fill_kv_cache`` gives it
(lines 917-953); nothing of LMDeploy is imported. Without a GPU the kernel runs under Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported).

    python lmdeploy-fp8-cache-nan.py [--path DIR] [--reference]

Case: DeepSeek-V2's MLA cache write as its engine makes it with ``quant_policy=QuantPolicy.FP8``: one decode
token, ``key_states [1, 1, 8]`` bfloat16 ``[NaN, 1, -2, 3, 0.5, 448, -600, 0]``, an E4M3 cache ``[2, 16, 1, 8]``,
``k_scale = v_scale = 1.0`` (``Attention``'s buffers), the value store skipped (the MLA value cache is a view of the
key cache). The token lands at block 1, entry 0. Line 216, ``tl.clamp(k, fp8_min, fp8_max)``, leaves
``propagate_nan`` at its default ``NONE``: a NaN is not propagated and comes out as a bound. On a GPU the clamp
compiles to ``min.xorsign.abs.f32`` (sm_90; no ``.NaN``: the result is the other operand's magnitude with the
NaN's sign), the E4M3 conversion to ``cvt.rn.satfinite``: +448 (0x7E) for a positive NaN. Triton's interpreter
takes ``max`` then ``min`` without NaN propagation: -448 (0xFE). Either way the cache holds a finite number
where the key was NaN, and attention reading it cannot see the NaN.

Exit 1: the NaN is stored as a finite code (the defect). Exit 0: it is stored as NaN (0x7F or 0xFF) and the
other seven codes are the saturating round-to-nearest-even codes. Exit 2: anything else. --reference writes the
cache with plain torch (divide by the scale, clamp the finite values, keep NaN) instead of the kernel, to show
the check passes.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import pathlib
import sys

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton reads it
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

RELATIVE = "pytorch/kernels/cuda/fill_kv_cache.py"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KEY = [float("nan"), 1.0, -2.0, 3.0, 0.5, 448.0, -600.0, 0.0]


def kernel_file(given: str | None) -> pathlib.Path | None:
    if given:
        return pathlib.Path(given) / "lmdeploy" / RELATIVE
    spec = importlib.util.find_spec("lmdeploy")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return pathlib.Path(list(spec.submodule_search_locations)[0]) / RELATIVE


def load_kernel(path: pathlib.Path):
    """``_fill_kv_cache_fp8_scalar_kernel`` compiled alone from the file, as ``@triton.jit`` builds it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_fill_kv_cache_fp8_scalar_kernel"]
    node.decorator_list = []  # @triton.jit, applied below; the line numbers stay the file's
    scope = {"triton": triton, "tl": tl}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), scope)
    return triton.jit(scope[node.name])


def write_with_kernel(kernel, k_states, k_caches, scale):
    """fill_kv_cache's launch (fill_kv_cache.py:917-953) for one decode sequence: history 0 at block 1."""
    finfo = torch.finfo(k_caches.dtype)
    q_start_loc, q_seqlens, kv_seqlens = (torch.tensor([v], device=DEVICE) for v in (0, 1, 1))
    block_offsets = torch.tensor([[1]], dtype=torch.int32, device=DEVICE)
    kernel[(1, 1, 1)](k_states, k_states, k_caches, k_caches, scale, scale, q_start_loc, q_seqlens, kv_seqlens,
                      block_offsets, fp8_min=finfo.min, fp8_max=finfo.max, is_decoding=True, head_dim=8, head_dim_v=0,
                      stride_kss=k_states.stride(-3), stride_ksh=k_states.stride(-2), stride_ksd=k_states.stride(-1),
                      stride_vss=k_states.stride(-3), stride_vsh=k_states.stride(-2), stride_vsd=k_states.stride(-1),
                      stride_kcn=k_caches.stride(0), stride_kcb=k_caches.stride(1), stride_kch=k_caches.stride(2),
                      stride_kcd=k_caches.stride(3), stride_vcn=k_caches.stride(0), stride_vcb=k_caches.stride(1),
                      stride_vch=k_caches.stride(2), stride_vcd=k_caches.stride(3), stride_boff=block_offsets.stride(0),
                      BLOCK=16, BLOCK_D=8, BLOCK_DV=0, num_warps=4, num_stages=3)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", default=os.environ.get("LMDEPLOY_PATH"), help="a directory holding lmdeploy/")
    parser.add_argument("--reference", action="store_true", help="write with plain torch (the check passes)")
    args = parser.parse_args()
    path = kernel_file(args.path)
    if path is None or not path.is_file():
        print(f"no kernel file ({path}): pass --path DIR (an unpacked lmdeploy wheel)")
        return 2
    backend = "GPU" if DEVICE == "cuda" else "Triton interpreter (no GPU)"
    print(f"{path}, torch {torch.__version__}, triton {triton.__version__}, {backend}")

    k_states = torch.tensor(KEY, dtype=torch.bfloat16, device=DEVICE).view(1, 1, 8)
    k_caches = torch.zeros(2, 16, 1, 8, dtype=torch.float8_e4m3fn, device=DEVICE)
    scale = torch.ones((), dtype=torch.float32, device=DEVICE)
    if args.reference:  # CONTRACT §3: code = rne_satfinite(x / scale), NaN stays NaN
        x = k_states.float() / scale
        k_caches[1, 0] = torch.where(x.isnan(), x, x.clamp(-448.0, 448.0))[0].to(torch.float8_e4m3fn)
    else:
        write_with_kernel(load_kernel(path), k_states, k_caches, scale)
    codes = k_caches[1, 0, 0].view(torch.uint8).cpu().tolist()
    finite = torch.tensor(KEY[1:]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    print(f"key {KEY} stored as codes {[hex(c) for c in codes]}")
    if codes[1:] != finite:
        print(f"neither: the finite codes differ from {[hex(c) for c in finite]}")
        return 2
    if codes[0] & 0x7F == 0x7F:
        print("conforms: the NaN is stored as NaN")
        return 0
    print(f"DEFECT: the NaN key is stored as the finite code {codes[0]:#04x} "
          f"({float(k_caches[1, 0, 0, 0]):g}): fill_kv_cache.py line 216, tl.clamp without propagate_nan")
    return 1


if __name__ == "__main__":
    sys.exit(main())
