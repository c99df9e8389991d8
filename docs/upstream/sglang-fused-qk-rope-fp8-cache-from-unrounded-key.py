"""SGLang: fused_qk_rope_reshape_and_cache caches the fp8 code of its fp32 rotation, not of the key it writes back.

Standalone: needs torch, triton and SGLang's file sglang/kernels/ops/attention/fused_qk_rope_reshape_and_cache.py
(an installed sglang, or an unpacked wheel: --path DIR, the directory holding sglang/). The file imports only
torch and triton, so it is loaded on its own; nothing else of SGLang is imported. Without a GPU the kernel
runs under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).

    python sglang-fused-qk-rope-fp8-cache-from-unrounded-key.py [--path DIR] [--reference]

Case: one token at position 1, one head, head size 8, float16 q/k/v, NeoX rope with a float32 table (base
10000), fp8 E4M3 flash caches [2 blocks, 1 slot, 1 head, 8], k_scale = v_scale = 1, the token at slot 1, and
k = [0.96484375, 0, 0, 0, -0.9404296875, 0, 0, 0]. Its rotated element 0 is 1.31265... in fp32; the kernel writes
it back as float16 1.3125 (k_out = key, in place, as SGLang's ROCm rotary passes it), exactly midway between the
E4M3 values 1.25 and 1.375, and caches the code of the fp32 value, 1.375. SGLang's unfused path (rope in place,
then MHATokenToKVPool.set_kv_buffer: ``cache_k.div_(k_scale)``, ``cache_k.to(fp8)``, memory_pool.py:2926-2931)
quantizes the float16 key written back: the tie goes to even, 1.25. The values are chosen far (2^-13) from
every rounding boundary but that one, so the fp32 arithmetic's order (FMA or not) cannot change the result, and
away from the E4M3 values just below a power of two (Triton's interpreter converts those wrongly).

Exit 1: the cache holds 1.375 (0x3b) where the written-back key 1.3125 has the code 1.25 (0x3a), the rest of the
entry equal (the defect). Exit 0: the cache holds the codes of the key written back. Exit 2: anything else.
--reference writes the cache with plain torch as SGLang's unfused path does (rotate, round to float16, quantize),
to show the check passes.
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
D, HALF = 8, 4
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

    k = torch.zeros(1, 1, D, dtype=torch.float16, device=DEVICE)
    k[0, 0, 0], k[0, 0, HALF] = 0.96484375, -0.9404296875
    q, v = k.clone(), torch.ones_like(k)
    positions = torch.tensor([1], device=DEVICE)
    slot_mapping = torch.tensor([1], device=DEVICE)
    inverse = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.outer(torch.arange(4, dtype=torch.float64), inverse)
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(DEVICE)  # [positions, D]: cos | sin
    key_cache, value_cache = (torch.zeros(2, 1, 1, D, dtype=E4M3, device=DEVICE) for _ in range(2))
    scale = torch.ones(1, dtype=torch.float32, device=DEVICE)
    if args.reference:  # SGLang's unfused path: rope in place (float16), then the pool quantizes the rounded key
        cos, sin = cos_sin[positions][:, None].chunk(2, dim=-1)
        x1, x2 = k.float().chunk(2, dim=-1)
        k.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(torch.float16))
        key_cache[1].copy_((k.float() / scale).to(E4M3))
        value_cache[1].copy_((v.float() / scale).to(E4M3))
    else:
        module.fused_qk_rope_reshape_and_cache(
            q, k, v, key_cache, value_cache, slot_mapping, positions, cos_sin, scale, scale, is_neox=True,
            flash_layout=True, offs=None, q_out=q, k_out=k, output_zeros=False)
    cached = key_cache[1, 0, 0].view(torch.uint8)
    written_back = k[0, 0].float().to(E4M3).view(torch.uint8)  # round to nearest even (no value near the max)
    print(f"key written back {[float(x) for x in k[0, 0]]}")
    print(f"cached codes {[hex(int(c)) for c in cached]}; codes of the key written back "
          f"{[hex(int(c)) for c in written_back]}")
    if torch.equal(cached, written_back):
        print("conforms: the cache holds the codes of the key written back (SGLang's unfused path does the same)")
        return 0
    if (float(k[0, 0, 0]) == 1.3125 and int(cached[0]) == 0x3B and int(written_back[0]) == 0x3A
            and torch.equal(cached[1:], written_back[1:])):
        print("DEFECT: element 0 rotates to 1.31265 in fp32, is written back as float16 1.3125 (midway between E4M3 "
              "1.25 and 1.375: the unfused path caches 1.25, 0x3a) but cached as 1.375 (0x3b), the code of the "
              "fp32 rotation: the cache does not hold the key written back (fused_qk_rope_reshape_and_cache.py: "
              "k_pe stored to k_out at line 366, then k_pe * k_scale_rcprl (line 373), still fp32, quantized at "
              "line 404)")
        return 1
    print("neither: unexpected cached codes")
    return 2


if __name__ == "__main__":
    sys.exit(main())
