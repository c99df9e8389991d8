"""The TTIR a GPU compile of LMDeploy's ``apply_rotary_pos_emb_qk_kernel`` starts from, built without a GPU
(tests/test_lmdeploy.py): how line 87's ``q_ptr = Q + pos_offset * stride_qs`` is typed when the token stride
fits in int32. ``stride_qs`` is a ``tl.constexpr`` (line 33): the wrapper passes ``q.stride(-3)``, a Python int,
which Triton makes an ``i32`` constant when it fits. Prints the multiply and the ``tt.addptr`` it feeds.

    python lmdeploy_rope_ttir.py PATH/lmdeploy/pytorch/kernels/cuda/apply_rotary_pos_emb.py
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

from mla_fuse_conformance.running.foreign_kernels import load_jit_functions  # noqa: E402

STRIDE = 2 ** 30 + 1  # the query's token stride: fits in int32, twice it does not
CONSTEXPRS = {"stride_qs": STRIDE, "stride_qh": 8, "stride_qd": 1, "stride_ks": 8, "stride_kh": 8, "stride_kd": 1,
              "stride_qes": STRIDE, "stride_qeh": 8, "stride_qed": 1, "stride_kes": 8, "stride_keh": 8,
              "stride_ked": 1, "half_size": 4, "BLOCK": 16, "BLOCK_QH": 1, "BLOCK_N": 4, "COMPLEX": False}

path = pathlib.Path(sys.argv[1])
functions = load_jit_functions(path, {"_apply_rotary_impl": ["triton.jit"],
                                      "apply_rotary_pos_emb_qk_kernel": ["triton.jit(do_not_specialize=('seq_len',))"]},
                               {"triton": triton, "tl": tl}, False)
kernel = functions["apply_rotary_pos_emb_qk_kernel"]
names = kernel.arg_names
types = {"Q": "*fp16", "K": "*fp16", "COS": "*fp16", "SIN": "*fp16", "Q_EMB": "*fp16", "K_EMB": "*fp16",
         "seq_len": "i32"}
signature = {name: types.get(name, "constexpr") for name in names}
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
lines = [line.strip().split(" loc(")[0] for line in str(module).splitlines()]
constant = next(line.split(" = ")[0] for line in lines if f"arith.constant dense<{STRIDE}>" in line)
print(next(line for line in lines if f"arith.constant dense<{STRIDE}>" in line))
product_line = next(line for line in lines if "arith.muli" in line and constant in line)
print(product_line)
product = product_line.split(" = ")[0]
print(next(line for line in lines if "tt.addptr" in line and product in line))
