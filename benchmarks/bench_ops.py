"""Benchmark of the fused MLA RoPE + cache write (not a test; nothing here is asserted).

On a GPU: for decode (T = 1, 8, 64, 256) and prefill (T = 1k, 4k, 16k) token
counts, H in {16, 128}, L = 512, R = 64, bf16, ``auto`` and ``fp8`` caches, it times

* ``fused``     ``mla_fuse::concat_and_cache_mla_rope_fused`` (one kernel),
* ``unfused``   ``mla_fuse::rotary_embedding`` then ``mla_fuse::concat_and_cache_mla``,
* ``reference`` ``reference.ops.concat_and_cache_mla_rope_fused`` (eager float64),

with ``triton.testing.do_bench`` and prints microseconds, the achieved bandwidth
(the bytes the operation must move / time) and its fraction of the device's peak
HBM bandwidth; ``--out DIR`` also writes ``bench_mla.json`` and, with matplotlib
installed, ``bench_mla.png``.

On a CPU the kernels run under Triton's interpreter: the same table for small
T gives interpreter figures (no bandwidth). ``--interpreter-goal`` measures the
project's interpreter-speed goal at T=64, H=16, L=512, R=64, bf16, fp8 cache: the
interpreted fused op against ``eager_fused_mla``, a vectorized eager torch version
of the same work (fp32 rotation, one rounding, fp8 with saturation, scatter into
the cache), goal within 10x; the float64 reference, a slower baseline, is printed
beside it. ``benchmarks/bench_throughput.py`` has the full picture (the fast CPU
path, the interpreter's memory-op floor, examples/s per property); docs/THROUGHPUT.md
has the figures.

    python benchmarks/bench_ops.py [--out DIR] [--tokens 1 8 64] [--heads 16]
    python benchmarks/bench_ops.py --interpreter-goal
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mla_fuse import ops  # noqa: F401  (registers torch.ops.mla_fuse)
from mla_fuse.kernels import INTERPRETED
from mla_fuse_reference import ops as ref_ops
from mla_fuse_reference.rope import plain_cos_sin_cache

LATENT, ROTARY, NOPE = 512, 64, 128
DECODE_TOKENS = (1, 8, 64, 256)
PREFILL_TOKENS = (1024, 4096, 16384)
GPU_HEADS = (16, 128)
CPU_TOKENS = (1, 8, 64)
CACHE_DTYPES = ("auto", "fp8")
# Peak HBM bandwidth, bytes/s, by a substring of torch.cuda.get_device_name().
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.039e12}
ELEMENT_BYTES = 2  # bf16


def bytes_moved(tokens: int, heads: int, kv_cache_dtype: str) -> int:
    """The bytes the fused operation must move (each read or written once), for bf16 inputs:

        q_pe  read + write  2 * T * H * R * 2
        k_pe  read + write  2 * T * R * 2
        kv_c  read              T * L * 2
        cache write             T * (L + R) * (1 for fp8, 2 for auto)
        cos|sin row read        T * R * 4        (fp32 table)
        positions, slots        2 * T * 8        (int64)
    """
    cache_bytes = 1 if kv_cache_dtype.startswith("fp8") else ELEMENT_BYTES
    return (2 * tokens * heads * ROTARY * ELEMENT_BYTES + 2 * tokens * ROTARY * ELEMENT_BYTES
            + tokens * LATENT * ELEMENT_BYTES + tokens * (LATENT + ROTARY) * cache_bytes
            + tokens * ROTARY * 4 + 2 * tokens * 8)


def make_inputs(tokens: int, heads: int, kv_cache_dtype: str, device: str, seed: int = 0) -> dict:
    """DeepSeek-shaped inputs: q_pe a slice of q, kv_c/k_pe slices of one projection, a GPT-J table."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, NOPE + ROTARY, generator=generator).to(torch.bfloat16).to(device)
    kv = torch.randn(tokens, LATENT + ROTARY, generator=generator).to(torch.bfloat16).to(device)
    block_size = 64
    num_blocks = -(-tokens // block_size) + 1
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else torch.bfloat16
    return dict(
        positions=torch.randint(0, 4096, (tokens,), generator=generator).to(device),
        q_pe=q[..., NOPE:], k_pe=kv[:, LATENT:], kv_c=kv[:, :LATENT],
        cos_sin_cache=plain_cos_sin_cache(ROTARY, 4096).to(device), is_neox=False,
        slot_mapping=torch.randperm(num_blocks * block_size, generator=generator)[:tokens].to(device),
        kv_cache=torch.zeros(num_blocks, block_size, LATENT + ROTARY, dtype=cache_dtype, device=device),
        kv_cache_dtype=kv_cache_dtype, kv_cache_scale=torch.tensor([0.05], device=device))


def runners(x: dict) -> dict:
    """The three ways to do the same work, as no-argument callables."""
    fused_args = (x["positions"], x["q_pe"], x["k_pe"], x["kv_c"], x["cos_sin_cache"], x["is_neox"],
                  x["slot_mapping"], x["kv_cache"], x["kv_cache_dtype"], x["kv_cache_scale"])

    def fused():
        torch.ops.mla_fuse.concat_and_cache_mla_rope_fused(*fused_args)

    def unfused():
        torch.ops.mla_fuse.rotary_embedding(x["positions"], x["q_pe"], x["k_pe"], ROTARY, x["cos_sin_cache"],
                                            x["is_neox"])
        torch.ops.mla_fuse.concat_and_cache_mla(x["kv_c"], x["k_pe"], x["kv_cache"], x["slot_mapping"],
                                                x["kv_cache_dtype"], x["kv_cache_scale"])

    def reference():
        ref_ops.concat_and_cache_mla_rope_fused(*fused_args)

    return {"fused": fused, "unfused": unfused, "reference": reference}


FP8_CAST = {"fp8": (torch.float8_e4m3fn, 448.0), "fp8_e4m3": (torch.float8_e4m3fn, 448.0),
            "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def eager_fused_mla(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype,
                    kv_cache_scale) -> None:
    """The fused MLA op's work as plain vectorized torch (the interpreter-speed baseline; fp8 caches only).

    cos|sin of each position, ``a' = a*c - b*s``, ``b' = b*c + a*s`` in fp32 rounded once to the
    input dtype (torch's cast) and written back into ``q_pe`` and ``k_pe``; the entries
    ``[kv_c | k_pe']`` quantized as ``fp8(clamp(float32(x) / scale, -max, max))`` and scattered
    into ``kv_cache[slot // B, slot % B]`` for ``slot >= 0``.
    """
    float8, max_finite = FP8_CAST[kv_cache_dtype]
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    for x, c, s in ((q_pe, cos[:, None], sin[:, None]), (k_pe, cos, sin)):
        a, b = x.float().chunk(2, -1) if is_neox else x.float().unflatten(-1, (-1, 2)).unbind(-1)
        a, b = a * c - b * s, b * c + a * s
        x.copy_(torch.cat((a, b), -1) if is_neox else torch.stack((a, b), -1).flatten(-2))
    entries = torch.cat((kv_c, k_pe), -1).float() / kv_cache_scale
    codes = entries.clamp(-max_finite, max_finite).to(float8).view(torch.uint8)
    write = slot_mapping >= 0
    slots, block_size = slot_mapping[write], kv_cache.size(1)
    kv_cache.view(torch.uint8)[slots // block_size, slots % block_size] = codes[: slot_mapping.numel()][write]


def time_cpu(fn, repeats: int = 7) -> float:
    """Fastest of ``repeats`` calls after one warm-up call (the least disturbed by other load)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def time_gpu(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn) * 1e-3  # do_bench returns milliseconds


def peak_bandwidth() -> tuple[str, float | None]:
    if not torch.cuda.is_available():
        return "cpu (Triton interpreter)", None
    name = torch.cuda.get_device_name()
    return name, next((peak for key, peak in PEAK_BANDWIDTH.items() if key in name), None)


def measure(token_counts, head_counts, cache_dtypes, skip_reference_above: int = 1 << 30) -> list[dict]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = time_gpu if device == "cuda" else time_cpu
    _, peak = peak_bandwidth()
    rows = []
    for heads in head_counts:
        for kv_cache_dtype in cache_dtypes:
            for tokens in token_counts:
                x = make_inputs(tokens, heads, kv_cache_dtype, device)
                moved = bytes_moved(tokens, heads, kv_cache_dtype)
                for name, fn in runners(x).items():
                    if name == "reference" and tokens > skip_reference_above:
                        continue
                    seconds = timer(fn)
                    bandwidth = moved / seconds
                    rows.append(dict(impl=name, tokens=tokens, heads=heads, kv_cache_dtype=kv_cache_dtype,
                                     us=seconds * 1e6, bytes=moved, gbps=bandwidth / 1e9,
                                     peak_fraction=None if peak is None else bandwidth / peak))
    return rows


def print_table(rows: list[dict]) -> None:
    device, peak = peak_bandwidth()
    print(f"device: {device}; peak HBM bandwidth: {'n/a' if peak is None else f'{peak / 1e12:.2f} TB/s'}")
    print(f"{'H':>4} {'cache':>6} {'T':>6} {'impl':>10} {'us':>11} {'GB/s':>9} {'% peak':>7} {'vs fused':>9}")
    fused_us = {(r["heads"], r["kv_cache_dtype"], r["tokens"]): r["us"] for r in rows if r["impl"] == "fused"}
    for r in rows:
        key = (r["heads"], r["kv_cache_dtype"], r["tokens"])
        fraction = "" if r["peak_fraction"] is None else f"{100 * r['peak_fraction']:.1f}"
        print(f"{r['heads']:>4} {r['kv_cache_dtype']:>6} {r['tokens']:>6} {r['impl']:>10} {r['us']:>11.1f} "
              f"{r['gbps']:>9.2f} {fraction:>7} {r['us'] / fused_us[key]:>8.2f}x")


def save(rows: list[dict], out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    device, peak = peak_bandwidth()
    with open(os.path.join(out_dir, "bench_mla.json"), "w") as f:
        json.dump({"device": device, "peak_bytes_per_s": peak, "rows": rows}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib for bench_mla.png)")
        return
    groups = sorted({(r["heads"], r["kv_cache_dtype"]) for r in rows})
    figure, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, (heads, kv_cache_dtype) in zip(axes[0], groups):
        for impl in ("fused", "unfused", "reference"):
            points = [(r["tokens"], r["us"]) for r in rows
                      if r["impl"] == impl and r["heads"] == heads and r["kv_cache_dtype"] == kv_cache_dtype]
            if points:
                ax.plot(*zip(*points), marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="microseconds",
               title=f"H={heads}, L={LATENT}, R={ROTARY}, bf16, {kv_cache_dtype}")
        ax.legend()
    figure.suptitle(device)
    figure.tight_layout()
    figure.savefig(os.path.join(out_dir, "bench_mla.png"), dpi=120)
    print(f"wrote {os.path.join(out_dir, 'bench_mla.png')}")


def interpreter_goal(repeats: int = 9) -> float:
    """Fused op (interpreter) time / vectorized eager torch time (``eager_fused_mla``) at T=64, H=16,
    bf16, fp8 cache; goal: < 10.

    torch runs on one thread here, like the interpreter (Python + numpy): a multi-threaded eager
    version on a loaded machine can be tens of times slower, which would flatter the ratio.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _interpreter_goal(repeats)
    finally:
        torch.set_num_threads(threads)


def fastest_interleaved(functions: dict, repeats: int, rounds: int = 3, clock=time.perf_counter) -> dict:
    """Seconds per call of each function by ``clock`` (wall by default; ``time.process_time`` counts
    only this process's CPU time): the fastest of ``rounds`` x ``repeats`` calls after a warm-up,
    the functions taking turns each round (robust to load from other processes)."""
    best = {name: float("inf") for name in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            fn()
            for _ in range(repeats):
                start = clock()
                fn()
                best[name] = min(best[name], clock() - start)
    return best


def _interpreter_goal(repeats: int) -> float:
    """The ratio by this process's CPU time; wall time is printed too. On a shared machine a long
    call (the interpreter) loses more wall time to other processes than a short one (eager)."""
    x = make_inputs(64, 16, "fp8", "cuda" if torch.cuda.is_available() else "cpu")
    run = runners(x)
    functions = {"fused": run["fused"], "eager": lambda: eager_fused_mla(**x), "reference": run["reference"]}
    for clock_name, clock in (("wall", time.perf_counter), ("CPU", time.process_time)):
        seconds = fastest_interleaved(functions, repeats, clock=clock)
        ratio = seconds["fused"] / seconds["eager"]
        print(f"interpreted={INTERPRETED}, 1 torch thread, T=64 H=16 L=512 R=64 bf16 fp8, {clock_name} time: fused "
              f"{seconds['fused'] * 1e3:.2f} ms, vectorized eager {seconds['eager'] * 1e3:.3f} ms, ratio {ratio:.1f}x "
              f"(goal < 10x: {'met' if ratio < 10 else 'NOT met'}); float64 reference {seconds['reference'] * 1e3:.2f} "
              f"ms (fused / reference {seconds['fused'] / seconds['reference']:.1f}x)")
    return ratio


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="bench_ops.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", help="token counts (default: per device)")
    parser.add_argument("--heads", type=int, nargs="+", help="head counts (default: 16 128 on GPU, 16 on CPU)")
    parser.add_argument("--caches", nargs="+", default=list(CACHE_DTYPES), choices=["auto", "fp8", "fp8_e5m2"])
    parser.add_argument("--out", help="directory for bench_mla.json and bench_mla.png")
    parser.add_argument("--interpreter-goal", action="store_true", help="measure the interpreter-speed goal only")
    args = parser.parse_args(argv)
    if args.interpreter_goal:
        interpreter_goal()
        return
    on_gpu = torch.cuda.is_available()
    tokens = args.tokens or (DECODE_TOKENS + PREFILL_TOKENS if on_gpu else CPU_TOKENS)
    heads = args.heads or (GPU_HEADS if on_gpu else (16,))
    rows = measure(tokens, heads, args.caches, skip_reference_above=4096 if on_gpu else 1 << 30)
    print_table(rows)
    if args.out:
        save(rows, args.out)


if __name__ == "__main__":
    main()
