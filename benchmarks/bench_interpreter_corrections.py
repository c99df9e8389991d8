"""What the interpreter's corrections cost a launch (``property_tests/running/interpreter_corrections.py``).

Times mla_fuse's MLA cache write (64 tokens, L = 512, R = 64, bf16, ``auto`` cache) under Triton's
interpreter, alternately with Triton's own interpreter and corrected, each the mean of ``--calls``
launches after one warm-up, ``--rounds`` times; prints each round. Figures, never asserted:
README "A Triton kernel on a machine without a GPU".

    TRITON_INTERPRET=1 python benchmarks/bench_interpreter_corrections.py [--calls 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch

import mla_fuse.ops
from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter


def mean_seconds(calls: int) -> float:
    tokens, latent, rope = 64, 512, 64
    kv_c, k_pe = torch.randn(tokens, latent, dtype=torch.bfloat16), torch.randn(tokens, rope, dtype=torch.bfloat16)
    cache = torch.zeros(16, 16, latent + rope, dtype=torch.bfloat16)
    slots, scale = torch.randperm(256)[:tokens], torch.ones(1)
    mla_fuse.ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", scale)
    start = time.perf_counter()
    for _ in range(calls):
        mla_fuse.ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", scale)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    for _ in range(options.rounds):
        for name, context in (("Triton's own", uncorrected_interpreter), ("corrected", corrected_interpreter)):
            with context():
                print(f"{name:>13}: {mean_seconds(options.calls) * 1e3:.2f} ms a launch")


if __name__ == "__main__":
    main()
