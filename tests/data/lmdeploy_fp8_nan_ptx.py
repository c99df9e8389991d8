"""The PTX a GPU runs for LMDeploy's fp8 cache write, built without a GPU (tests/test_lmdeploy.py): how
``_fill_kv_cache_fp8_scalar_kernel``'s ``tl.clamp(k, fp8_min, fp8_max).to(KCaches.dtype.element_ty)``
(fill_kv_cache.py:216) treats a NaN. Compiles the kernel as ``fill_kv_cache`` launches it for an MLA cache
(E4M3, a decode step, head dim 8, the value store skipped) for sm_90, and prints the TTIR clamp and the PTX
lines of the clamp and the conversion. ``--fixed`` compiles it with ``propagate_nan=tl.PropagateNan.ALL``.

    python lmdeploy_fp8_nan_ptx.py PATH/lmdeploy/pytorch/kernels/cuda/fill_kv_cache.py [--fixed]
"""

import os
import pathlib
import sys

os.environ.pop("TRITON_INTERPRET", None)  # the JIT's functions, not the interpreter's

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mla_fuse_conformance.running.foreign_kernels import load_jit_functions  # noqa: E402

CLAMP = "k = tl.clamp(k, fp8_min, fp8_max).to(KCaches.dtype.element_ty)"
FIXED = "k = tl.clamp(k, fp8_min, fp8_max, propagate_nan=tl.PropagateNan.ALL).to(KCaches.dtype.element_ty)"
CONSTEXPRS = {"fp8_min": -448.0, "fp8_max": 448.0, "is_decoding": True, "head_dim": 8, "head_dim_v": 0,
              "stride_kcn": 128, "stride_kcb": 8, "stride_kch": 8, "stride_kcd": 1, "stride_vcn": 128,
              "stride_vcb": 8, "stride_vch": 8, "stride_vcd": 1, "BLOCK": 16, "BLOCK_D": 8, "BLOCK_DV": 0}

path = pathlib.Path(sys.argv[1])
source = path.read_text()
if "--fixed" in sys.argv[2:]:
    assert source.count(CLAMP) == 1, "fill_kv_cache.py changed"
    source = source.replace(CLAMP, FIXED)
kernel = load_jit_functions(path, {"_fill_kv_cache_fp8_scalar_kernel": ["triton.jit"]}, {"triton": triton, "tl": tl},
                            False, source)["_fill_kv_cache_fp8_scalar_kernel"]
names = kernel.arg_names
pointers = {"KStates": "*bf16", "VStates": "*bf16", "KCaches": "*fp8e4nv", "VCaches": "*fp8e4nv", "KScale": "*fp32",
            "VScale": "*fp32", "QStartLoc": "*i64", "QSeqLens": "*i64", "KVSeqLens": "*i64", "BlockOffsets": "*i32"}
signature = {name: pointers.get(name, "constexpr" if name in CONSTEXPRS else "i32") for name in names}
compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                    constexprs={(names.index(name),): value for name, value in CONSTEXPRS.items()}),
                          target=GPUTarget("cuda", 90, 32))
print(next(line.strip() for line in compiled.asm["ttir"].splitlines() if "tt.clampf" in line).split(" loc(")[0])
for line in compiled.asm["ptx"].splitlines():
    if ".f32" in line and any(word in line for word in ("min.", "max.", "cvt.rn.satfinite.e4m3")):
        print(line.strip())
