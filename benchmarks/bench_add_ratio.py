"""An empty-batch call of the fused MLA op against torch's in-place ``aten.add_`` on one element.

The host cost of a call the kernel has nothing to do for (T = 0, DeepSeek-V3 MLA widths, 16
heads, fp8 cache, a layout the checks have seen: the checks' layout key, the dispatch, the
version bumps, no launch), through ``torch.ops`` and through ``mla_fuse.ops``, in units of the
cheapest in-place aten op timed in the same process, so the ratio holds on a fast or slow, idle
or loaded machine: per entry the least over ``--repeats`` runs of ``--number`` calls of the
calling thread's CPU time, the runs of the entries alternating. Figures: docs/INPUTS.md.

    python benchmarks/bench_add_ratio.py [--repeats 40] [--number 500]
"""

from __future__ import annotations

import argparse
import time

import torch

from mla_fuse import ops

OPERATION = "concat_and_cache_mla_rope_fused"


def empty_batch(device: str = "cpu") -> tuple:
    """DeepSeek-V3 MLA widths with no tokens: q_pe [0, 16, 64], kv_c [0, 512], k_pe [0, 64], fp8 cache."""
    kv = torch.empty(0, 512 + 64, device=device).bfloat16()
    q = torch.empty(0, 16, 128 + 64, device=device).bfloat16()
    return (torch.empty(0, dtype=torch.int64, device=device), q[..., 128:], kv[:, 512:], kv[:, :512],
            torch.randn(4096, 64, device=device), False, torch.empty(0, dtype=torch.int64, device=device),
            torch.zeros(16, 64, 512 + 64, dtype=torch.uint8, device=device), "fp8", torch.ones(1, device=device))


def least_us(calls: dict, repeats: int, number: int) -> dict[str, float]:
    """Per entry: the least over ``repeats`` runs of ``number`` calls of the thread's CPU time per call (us)."""
    least = dict.fromkeys(calls, float("inf"))
    for call in calls.values():
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.thread_time()
            for _ in range(number):
                call()
            least[name] = min(least[name], (time.thread_time() - start) / number * 1e6)
    return least


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--number", type=int, default=500)
    options = parser.parse_args()
    arguments, tiny = empty_batch(), torch.zeros(1)
    op = getattr(torch.ops.mla_fuse, OPERATION).default
    wrapper = getattr(ops, OPERATION)
    us = least_us({"aten.add_": lambda: torch.ops.aten.add_.Scalar(tiny, 1.0), "torch.ops": lambda: op(*arguments),
                   "mla_fuse.ops": lambda: wrapper(*arguments)}, options.repeats, options.number)
    print(", ".join(f"{name} {value:.2f} us" for name, value in us.items()), "|",
          ", ".join(f"{name} {us[name] / us['aten.add_']:.2f}x" for name in ("torch.ops", "mla_fuse.ops")))


if __name__ == "__main__":
    main()
