"""The TTIR a GPU compile of flash-attn's rotary_kernel starts from, built without a GPU
(tests/test_flash_attn_rotary.py): how line 51's ``X = X + pid_batch * stride_x_batch`` is typed when
stride_x_batch fits in int32. Prints the stride's type as Triton's launcher gives it, the multiply and the
``tt.addptr`` it feeds.

    python flash_attn_rotary_ttir.py PATH/flash_attn/ops/triton/rotary.py
"""

import os
import pathlib
import sys

os.environ.pop("TRITON_INTERPRET", None)  # the JIT's functions, not the interpreter's

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton._C.libtriton import ir  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from mla_fuse_conformance.running.foreign_kernels import load_jit_functions  # noqa: E402

STRIDE = 2 ** 30 + 1
CONSTEXPRS = {"ROTARY_DIM": 8, "IS_SEQLEN_OFFSETS_TENSOR": True, "IS_VARLEN": False, "INTERLEAVED": False,
              "CONJUGATE": False, "BLOCK_H": 2, "BLOCK_M": 8}

path = pathlib.Path(sys.argv[1])
kernel = load_jit_functions(path, {"rotary_kernel": ["triton.jit"]}, {"triton": triton, "tl": tl},
                            False)["rotary_kernel"]
# OUT, X, COS, SIN, CU_SEQLENS, SEQLEN_OFFSETS; seqlen, nheads, seqlen_ro; stride_out_batch, the other strides
types = ["*fp16"] * 4 + ["*i32", "*i64"] + ["i32"] * 3 + [mangle_type(STRIDE)] + ["i32"] * 7
names = kernel.arg_names
signature = dict(zip(names, types + ["constexpr"] * len(CONSTEXPRS)))
signature["stride_x_batch"] = mangle_type(STRIDE)
source = ASTSource(fn=kernel, signature=signature,
                   constexprs={(names.index(name),): value for name, value in CONSTEXPRS.items()})
target = GPUTarget("cuda", 90, 32)
backend = CUDABackend(target)
options = backend.parse_options({})
context = ir.context()
ir.load_dialects(context)
backend.load_dialects(context)
module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                        context)
print("stride_x_batch =", STRIDE, "is passed as", mangle_type(STRIDE), "(triton.runtime.jit.mangle_type)")
lines = [line.strip() for line in str(module).splitlines()]
for index, line in enumerate(lines):
    if "%pid_batch, %stride_x_batch" in line:
        product = line.split(" = ")[0]
        print(line[:120])
        print(next(later for later in lines[index:] if "tt.addptr" in later and product in later)[:160])
        break
