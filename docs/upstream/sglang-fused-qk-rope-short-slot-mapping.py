"""SGLang: fused_qk_rope_reshape_and_cache reads slot_mapping past its end when it is shorter than the tokens.

Standalone: needs torch, triton and SGLang's file sglang/kernels/ops/attention/fused_qk_rope_reshape_and_cache.py
(an installed sglang, or an unpacked wheel: --path DIR, the directory holding sglang/). The file imports only
torch and triton, so it is loaded on its own; nothing else of SGLang is imported. Without a GPU the kernel
runs under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).

    python sglang-fused-qk-rope-short-slot-mapping.py [--path DIR] [--reference]

Case: 3 tokens, one head, head size 8, float32, flash layout caches [4 blocks, 2 slots, 1 head, 8], a
slot_mapping of 2 entries (slots 1 and 2) that is a view of a 3-element tensor whose third element is 7
(what happens to lie after it in memory). The wrapper documents and asserts ``t_slot <= t`` ("The number of
tokens of slot_mapping should no more than that of q, k and v"); token 2 has no slot and must not be
written. No fp8 and no rounding is involved: values are compared exactly.

Exit 1: slot 7 was written with token 2's key or value (the defect). Exit 0: only slots 1 and 2 were written.
Exit 2: anything else. --reference writes the caches with plain torch instead of the kernel, to show the
check passes.
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

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 1, 8, generator=generator).to(DEVICE) for _ in range(3))
    storage = torch.tensor([1, 2, 7], dtype=torch.int64, device=DEVICE)
    slot_mapping = storage[:2]  # slots of tokens 0 and 1; token 2 has none
    positions = torch.tensor([1, 2, 3], device=DEVICE)
    inverse = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    angles = torch.outer(torch.arange(8, dtype=torch.float64), inverse)
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).float().to(DEVICE)  # [positions, D]: cos | sin
    key_cache, value_cache = (torch.zeros(4, 2, 1, 8, device=DEVICE) for _ in range(2))
    if args.reference:  # what the contract asks: tokens past slot_mapping's end are not written
        for token, slot in enumerate(slot_mapping.tolist()):
            key_cache.view(8, 1, 8)[slot] = k[token]  # (unrotated: only which slots are written is checked)
            value_cache.view(8, 1, 8)[slot] = v[token]
    else:
        module.fused_qk_rope_reshape_and_cache(
            q, k, v, key_cache, value_cache, slot_mapping, positions, cos_sin, None, None, is_neox=True,
            flash_layout=True, offs=None, q_out=q, k_out=k, output_zeros=False)
    written = sorted({s for cache in (key_cache, value_cache) for s in range(8)
                      if cache.view(8, 1, 8)[s].abs().sum() > 0})
    print(f"slot_mapping {slot_mapping.tolist()} for 3 tokens (the memory after it holds 7); slots written: {written}")
    if written == [1, 2]:
        print("conforms: only the slots of slot_mapping were written")
        return 0
    if 7 in written and torch.equal(value_cache.view(8, 1, 8)[7], v[2]):
        print("DEFECT: token 2, past slot_mapping's end, was written at slot 7: the kernel loaded slot_mapping[2] "
              "(fused_qk_rope_reshape_and_cache.py line 329: no pid_t < T_slot check)")
        return 1
    print("neither: unexpected slots written")
    return 2


if __name__ == "__main__":
    sys.exit(main())
