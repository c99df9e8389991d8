"""How the fused MLA kernel's launch configuration sets its bandwidth (not a test; nothing here is asserted).

docs/GPU.md has the fused op at 55-82% of a device-to-device copy for T >= 4096 (the target is
85% at T >= 16384, every row). Where the time goes depends on the launch configuration
``mla_fuse.kernels.config`` picks per layout: tokens per program (``token_block``), query heads
per program (``heads_per_program``) and warps (``num_warps``). This script times
``torch.ops.mla_fuse.concat_and_cache_mla_rope_fused`` under CUDA-graph replay for each
configuration of a grid, with those three functions replaced for the run (the kernel itself is
unchanged: every configuration is a launch the kernel supports, power-of-two tiles), and prints
per row (T, H, cache) the configuration ``config`` picks and its share of a copy of the same bytes
timed in the same run, then every configuration of the grid, best first, each with whether it
wrote the bytes the default configuration wrote (it must: the kernel's result does not depend on
its tiling). What it shows goes into ``config``'s rules, measured again by ``bench_ops.py``.

On a CPU the kernels run under Triton's interpreter: one small row, CPU seconds, to check the
wiring (no bandwidth).

    python benchmarks/bench_tiles.py [--tokens 4096 16384] [--heads 16 128] [--caches auto fp8]
        [--tokens-per-program 1 2 4 8] [--heads-per-program 16 64] [--warps 4 8]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_ops  # noqa: E402  (the inputs, byte count, copy and timers of the main benchmark)

from mla_fuse import layouts  # noqa: E402
from mla_fuse.kernels import config, mla_rope_cache  # noqa: E402

OUTPUTS = ("kv_cache", "q_pe", "k_pe")


@contextlib.contextmanager
def configured(tokens_per_program: int | None, heads_per_program: int | None, warps: int | None):
    """Launches with this configuration (None: ``config``'s own choice): ``config``'s three rules
    replaced, the memoized launch configurations and the checkers' plans dropped on entry and exit."""
    rules = {"token_block": config.token_block, "heads_per_program": config.heads_per_program,
             "num_warps": config.num_warps}
    if tokens_per_program is not None:
        config.token_block = lambda num_tokens, elements_per_token: tokens_per_program
    if heads_per_program is not None:
        config.heads_per_program = lambda num_heads, elements_per_head: min(num_heads, heads_per_program)
    if warps is not None:
        config.num_warps = lambda tile_elements: warps

    def drop():
        mla_rope_cache.launch_config.cache_clear()
        layouts.forget_layouts()

    drop()
    try:
        yield
    finally:
        for name, rule in rules.items():
            setattr(config, name, rule)
        drop()


def chosen(tokens: int, heads: int, kv_cache_dtype: str) -> tuple[int, int, int]:
    """(tokens per program, heads per program, warps) ``config`` picks for this row."""
    fp8 = "e4m3" if kv_cache_dtype.startswith("fp8") else None
    _, heads_per_program, constexprs = mla_rope_cache.launch_config(tokens, heads, bench_ops.ROTARY, bench_ops.LATENT,
                                                                    False, fp8)
    return constexprs["BLOCK_TOKENS"], heads_per_program, constexprs["num_warps"]


def fused(inputs: dict):
    """The fused op on ``bench_ops.make_inputs``' inputs, as a no-argument callable."""
    args = [inputs[name] for name in ("positions", "q_pe", "k_pe", "kv_c", "cos_sin_cache", "is_neox", "slot_mapping",
                                      "kv_cache", "kv_cache_dtype", "kv_cache_scale")]
    return lambda: torch.ops.mla_fuse.concat_and_cache_mla_rope_fused(*args)


def run_once(tokens: int, heads: int, kv_cache_dtype: str, device: str) -> dict:
    """The outputs of one call on the benchmark's inputs (seeded: the same inputs every time)."""
    inputs = bench_ops.make_inputs(tokens, heads, kv_cache_dtype, device)
    fused(inputs)()
    return {name: inputs[name].clone() for name in OUTPUTS}


def same_bytes(a: dict, b: dict) -> bool:
    return all(bench_ops.differing_bytes(a[name], b[name]) == 0 for name in OUTPUTS)


def timed(tokens: int, heads: int, kv_cache_dtype: str, device: str) -> float:
    """Seconds per call: under CUDA-graph replay on a GPU, the least of a few calls on a CPU."""
    call = fused(bench_ops.make_inputs(tokens, heads, kv_cache_dtype, device))
    return bench_ops.time_graph(call) if device == "cuda" else bench_ops.time_cpu(call, repeats=2)


def sweep(tokens: int, heads: int, kv_cache_dtype: str, grid, device: str) -> tuple[tuple, list[dict]]:
    """The configuration ``config`` picks, and one entry per configuration (None: ``config``'s choice)."""
    default = chosen(tokens, heads, kv_cache_dtype)
    with configured(None, None, None):
        wanted = run_once(tokens, heads, kv_cache_dtype, device)
    entries = []
    for tokens_per_program, heads_per_program, warps in [(None, None, None), *grid]:
        if heads_per_program is not None and heads_per_program > heads:
            continue
        with configured(tokens_per_program, heads_per_program, warps):
            launch = chosen(tokens, heads, kv_cache_dtype)
            try:
                same = same_bytes(run_once(tokens, heads, kv_cache_dtype, device), wanted)
                seconds, error = timed(tokens, heads, kv_cache_dtype, device), None
            except Exception as failure:  # a configuration the compiler refuses (registers, shared memory)
                same, seconds, error = False, None, f"{type(failure).__name__}: {str(failure).splitlines()[0]}"[:100]
        entries.append(dict(launch=launch, default=tokens_per_program is None, same=same, seconds=seconds,
                            error=error))
    return default, entries


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpu = torch.cuda.is_available()
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384] if gpu else [8])
    parser.add_argument("--heads", type=int, nargs="+", default=[16, 128] if gpu else [4])
    parser.add_argument("--caches", nargs="+", default=list(bench_ops.CACHE_DTYPES))
    parser.add_argument("--tokens-per-program", type=int, nargs="+", default=[1, 2, 4, 8] if gpu else [1, 8])
    # the default grid: 24 kernels per cache format, about 2 s of compiling each on a GPU host
    parser.add_argument("--heads-per-program", type=int, nargs="+", default=[16, 64] if gpu else [4])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8] if gpu else [4])
    options = parser.parse_args(argv)
    device = "cuda" if gpu else "cpu"
    grid = list(itertools.product(options.tokens_per_program, options.heads_per_program, options.warps))
    name, _ = bench_ops.peak_bandwidth()
    print(f"fused MLA launch configurations on {name}; L={bench_ops.LATENT}, R={bench_ops.ROTARY}, bf16; "
          f"{'CUDA-graph replay, share of a same-byte copy timed in this run' if gpu else 'CPU seconds (wiring only)'}")
    for heads, kv_cache_dtype, tokens in itertools.product(options.heads, options.caches, options.tokens):
        moved = bench_ops.bytes_moved(tokens, heads, kv_cache_dtype)
        copy = bench_ops.copy_seconds(moved) if gpu else None
        default, entries = sweep(tokens, heads, kv_cache_dtype, grid, device)

        def share(entry) -> str:
            if entry["seconds"] is None:
                return entry["error"] or "-"
            if copy is None:
                return f"{entry['seconds']:.3g} s"
            return f"{copy / entry['seconds']:5.0%} of copy ({entry['seconds'] * 1e6:7.1f} us)"

        print(f"\nT={tokens} H={heads} {kv_cache_dtype}: {moved / 1e6:.1f} MB moved"
              + (f", copy {copy * 1e6:.1f} us" if copy else ""))
        ordered = sorted(entries, key=lambda e: (e["seconds"] is None, e["seconds"] or 0.0))
        for entry in ordered:
            tokens_per_program, heads_per_program, warps = entry["launch"]
            mark = "config's choice" if entry["default"] else ""
            print(f"  tokens/program {tokens_per_program:2d}  heads/program {heads_per_program:3d}  warps {warps}  "
                  f"{share(entry):32}  {'same bytes' if entry['same'] else 'DIFFERENT BYTES'}  {mark}")
        best = next((entry for entry in ordered if entry["seconds"] is not None and entry["same"]), None)
        mine = next(entry for entry in entries if entry["default"])
        if best is not None:
            print(f"summary: T={tokens} H={heads} {kv_cache_dtype}: config {default} {share(mine).strip()}; "
                  f"best {best['launch']} {share(best).strip()}")


if __name__ == "__main__":
    main()
