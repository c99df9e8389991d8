"""SGLang: fused_qk_rope_reshape_and_cache multiplies by 1 / scale where its unfused path divides by the scale.

Standalone: needs torch, triton and SGLang's file sglang/kernels/ops/attention/fused_qk_rope_reshape_and_cache.py
(an installed sglang, or an unpacked wheel: --path DIR, the directory holding sglang/). The file imports only
torch and triton, so it is loaded on its own; nothing else of SGLang is imported. Without a GPU the kernel
runs under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).

    python sglang-fused-qk-rope-fp8-scale-reciprocal.py [--path DIR] [--reference]

Case: one token at position 0 (cos 1, sin 0: the rope changes nothing), one head, head size 8, float32
q/k/v, NeoX rope with a float32 table, fp8 E4M3 flash caches [2 blocks, 1 slot, 1 head, 8], the token at
slot 1, k = 0, k_scale = 1, v = [1.30624998, 0, ...] (a float32 value), v_scale = 1.1 (float32 1.10000002).
SGLang's unfused path (MHATokenToKVPool.set_kv_buffer: ``cache_v.div_(v_scale)``, ``cache_v.to(fp8)``,
memory_pool.py:2926-2931) and CONTRACT section 3 divide in float32: the quotient rounds to 1.1875 exactly, the
midpoint of E4M3 1.125 (0x39) and 1.25 (0x3a), to even: 0x3a. The fused kernel multiplies by the reciprocal
(``v_scale_rcprl = 1 / v_scale``, ``v * v_scale_rcprl``, lines 424-425; lines 372-373 for k): 1 / 1.1 is
0.909090936 in float32, and the product 1.18749988, one float32 step below the midpoint: code 0x39. The case
is robust under Triton's interpreter, whose fp8 conversion rounds ties up (triton#8322): the kernel's product
is not a tie, and a kernel that divides gets the tie, whose even neighbour is the upper one; 1.1875 lies
mid-binade, far from the values just below a power of two that the interpreter converts wrongly. (A kernel
file patched to divide, ``tl.load(v_ptrs).to(tl.float32) / v_scale``, exits 0.)

Exit 1: the value cache holds 0x39 where the quotient's code is 0x3a, the rest of the entry equal (the
defect). Exit 0: the cache holds the codes of the float32 quotients. Exit 2: anything else.
--reference writes the cache with plain torch as SGLang's unfused path does (divide, then convert), to show
the check passes.
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
import triton  # noqa: E402,F401

RELATIVE = "kernels/ops/attention/fused_qk_rope_reshape_and_cache.py"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
D = 8
E4M3 = torch.float8_e4m3fn


def kernel_module(given: str | None):
    if given:
        path = pathlib.Path(given) / "sglang" / RELATIVE
    else:
        spec = importlib.util.find_spec("sglang")  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            return None, None
        path = pathlib.Path(list(spec.submodule_search_locations)[0]) / RELATIVE
    if not path.is_file():
        return None, path
    spec = importlib.util.spec_from_file_location("fused_qk_rope_reshape_and_cache", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # torch and triton only
    return module, path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--path", default=os.environ.get("SGLANG_PATH"), help="a directory holding sglang/")
    parser.add_argument("--reference", action="store_true", help="write with plain torch (the check passes)")
    args = parser.parse_args()
    module, path = kernel_module(args.path)
    if module is None:
        print(f"no kernel file ({path}): pass --path DIR (an unpacked sglang wheel)")
        return 2
    backend = "GPU" if DEVICE == "cuda" else "Triton interpreter (no GPU)"
    print(f"{path}, torch {torch.__version__}, triton {triton.__version__}, {backend}")

    k = torch.zeros(1, 1, D, dtype=torch.float32, device=DEVICE)
    q, v = k.clone(), k.clone()
    v[0, 0, 0] = 1.306249976158142  # float32 0x3fa73333
    positions = torch.tensor([0], device=DEVICE)
    slot_mapping = torch.tensor([1], device=DEVICE)
    cos_sin = torch.cat([torch.ones(1, D // 2), torch.zeros(1, D // 2)], dim=-1).to(DEVICE)  # position 0: cos | sin
    key_cache, value_cache = (torch.zeros(2, 1, 1, D, dtype=E4M3, device=DEVICE) for _ in range(2))
    k_scale = torch.ones(1, dtype=torch.float32, device=DEVICE)
    v_scale = torch.full((1,), 1.1, dtype=torch.float32, device=DEVICE)
    if args.reference:  # SGLang's unfused path: the pool divides by the scale in float32, then converts
        key_cache[1].copy_((k.float() / k_scale).to(E4M3))
        value_cache[1].copy_((v.float() / v_scale).to(E4M3))
    else:
        module.fused_qk_rope_reshape_and_cache(
            q, k, v, key_cache, value_cache, slot_mapping, positions, cos_sin, k_scale, v_scale, is_neox=True,
            flash_layout=True, offs=None, q_out=q, k_out=k, output_zeros=False)
    quotient = v[0, 0].float() / v_scale  # CONTRACT section 3 and memory_pool.py:2926-2931
    want = quotient.to(E4M3).view(torch.uint8)  # round to nearest even (no value near the max)
    cached = value_cache[1, 0, 0].view(torch.uint8)
    key_ok = torch.equal(key_cache[1, 0, 0].view(torch.uint8), torch.zeros(D, dtype=torch.uint8, device=DEVICE))
    print(f"float32 quotient v / v_scale {float(quotient[0])!r}; reciprocal product v * (1 / v_scale) "
          f"{float(v[0, 0, 0].float() * (1 / v_scale[0]))!r}")
    print(f"cached value codes {[hex(int(c)) for c in cached]}; codes of the quotients {[hex(int(c)) for c in want]}")
    if torch.equal(cached, want) and key_ok:
        print("conforms: the cache holds the codes of v / v_scale (SGLang's unfused path does the same)")
        return 0
    if key_ok and int(cached[0]) == 0x39 and int(want[0]) == 0x3A and torch.equal(cached[1:], want[1:]):
        print("DEFECT: 1.30624998 / 1.1 is 1.1875 in float32, midway between E4M3 1.125 and 1.25 (the unfused path "
              "caches 1.25, 0x3a, to even), but the fused kernel multiplies by 1 / v_scale = 0.909090936 (float32), "
              "1.18749988, and caches 1.125 (0x39) (fused_qk_rope_reshape_and_cache.py:424-425, v * v_scale_rcprl; "
              "372-373 for k)")
        return 1
    print("neither: unexpected cached codes")
    return 2


if __name__ == "__main__":
    sys.exit(main())
