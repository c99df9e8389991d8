"""Benchmark of the fused MLA RoPE + cache write (not a test; nothing here is asserted).

On a GPU: for decode (T = 1, 8, 64, 256) and prefill (T = 1k, 4k, 16k) token
counts, H in {16, 128}, L = 512, R = 64, bf16, ``auto`` and ``fp8`` caches, it times

* ``fused``     ``mla_fuse::concat_and_cache_mla_rope_fused`` (one kernel),
* ``unfused``   ``mla_fuse::rotary_embedding`` then ``mla_fuse::concat_and_cache_mla``,
* ``flaggems``  FlagGems' Triton rope (``apply_rotary_pos_emb``, in place) then its
  ``concat_and_cache_mla``, where ``flag_gems`` imports (the peer that runs on these machines),

three ways each, side by side: eager (``do_bench``: CUDA events around repeated calls, the
host's cost per call where it exceeds the kernel's), under CUDA-graph replay
(``do_bench_cudagraph``, as engines replay decode steps: the kernels' own time), and the host
microseconds to issue one call. Bandwidth is the bytes the operation must move
(``bytes_moved``) over its graph time, and "of copy" compares it with a device-to-device
copy moving the same bytes, timed in a graph in the same run (the 1 GiB copy's rate is
printed too). A peer's row says how many bytes of the cache, q_pe and k_pe differ from ours
on the same inputs. ``--out DIR`` also writes ``bench_mla.json`` and, with matplotlib
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
    """The ways to do the same work, as no-argument callables: ours fused and unfused, the float64
    reference, and FlagGems' Triton rope + MLA cache write where ``flag_gems`` imports (a GPU)."""
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

    found = {"fused": fused, "unfused": unfused, "reference": reference}
    peer = flaggems_runner(x)
    if peer is not None:
        found["flaggems"] = peer
    return found


_FLAGGEMS: dict = {}


def flaggems_runner(x: dict):
    """FlagGems 5's rope (``apply_rotary_pos_emb``, in place, separate cos and sin tables, ``k`` with a
    head axis) then its ``concat_and_cache_mla``: the unfused pair as FlagGems ships it, or None
    where ``flag_gems`` does not import (it needs a GPU; the reason is printed once)."""
    if "error" not in _FLAGGEMS and "ops" not in _FLAGGEMS:
        try:
            from flag_gems.fused.concat_and_cache_mla import concat_and_cache_mla
            from flag_gems.fused.rotary_embedding import apply_rotary_pos_emb

            _FLAGGEMS["ops"] = apply_rotary_pos_emb, concat_and_cache_mla
        except Exception as error:  # ImportError, or its device detection on a machine without a GPU
            _FLAGGEMS["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            print(f"FlagGems not timed: {_FLAGGEMS['error']}")
    if "ops" not in _FLAGGEMS:
        return None
    rope, cache_write = _FLAGGEMS["ops"]
    half = ROTARY // 2
    cos, sin = x["cos_sin_cache"][:, :half], x["cos_sin_cache"][:, half:]
    k_heads = x["k_pe"].unsqueeze(1)

    def flaggems():
        rope(x["q_pe"], k_heads, cos, sin, x["positions"], rotary_interleaved=not x["is_neox"], inplace=True)
        cache_write(x["kv_c"], x["k_pe"], x["kv_cache"], x["slot_mapping"], x["kv_cache_dtype"], x["kv_cache_scale"])

    return flaggems


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
    """Eager: CUDA events around repeated calls (``do_bench``); where the host issues calls slower than
    the GPU runs them, this is the host's cost per call."""
    import triton.testing

    return triton.testing.do_bench(fn) * 1e-3  # do_bench returns milliseconds


def time_graph(fn) -> float:
    """Under CUDA-graph replay (``do_bench_cudagraph``: calls captured once, replayed), as engines run
    decode steps: the kernels' own time, no host cost."""
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn) * 1e-3


def host_seconds(fn, calls: int = 200) -> float:
    """Host time to issue one call: a loop of ``calls`` timed on the CPU clock, not waiting for the GPU
    (the launch queue holds far more than ``calls`` kernels)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return seconds


def copy_seconds(moved: int) -> float:
    """A device-to-device copy of ``moved / 2`` bytes (it reads and writes ``moved`` bytes in all) under
    CUDA-graph replay: the yardstick an operation that moves ``moved`` bytes is measured against."""
    source = torch.empty(max(moved // 2, 1), dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    return time_graph(lambda: target.copy_(source))


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes per second (read + written) of a 1 GiB device-to-device copy under graph replay."""
    return 2 * nbytes / copy_seconds(2 * nbytes)


def peak_bandwidth() -> tuple[str, float | None]:
    if not torch.cuda.is_available():
        return "cpu (Triton interpreter)", None
    name = torch.cuda.get_device_name()
    return name, next((peak for key, peak in PEAK_BANDWIDTH.items() if key in name), None)


def differing_bytes(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).sum())


def agreement(tokens: int, heads: int, kv_cache_dtype: str, device: str, impl: str) -> int | None:
    """Bytes of the cache, q_pe and k_pe where ``impl`` differs from ours fused, on the same inputs."""
    ours, theirs = (make_inputs(tokens, heads, kv_cache_dtype, device) for _ in range(2))
    runners(ours)["fused"]()
    peer = runners(theirs).get(impl)
    if peer is None:
        return None
    peer()
    return sum(differing_bytes(ours[name], theirs[name]) for name in ("kv_cache", "q_pe", "k_pe"))


def _timed(timer, fn) -> tuple[float | None, str | None]:
    try:
        return timer(fn), None
    except Exception as error:  # a peer that cannot be captured or launched: reported in its row
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:160]


def measure(token_counts, head_counts, cache_dtypes, skip_reference_above: int = 1 << 30) -> list[dict]:
    """One row per (H, cache, T, implementation). On a GPU: eager, graph-replay and host microseconds
    per call, the same-size copy's graph time, the bytes moved; on a CPU the interpreter's time only."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for heads in head_counts:
        for kv_cache_dtype in cache_dtypes:
            for tokens in token_counts:
                x = make_inputs(tokens, heads, kv_cache_dtype, device)
                moved = bytes_moved(tokens, heads, kv_cache_dtype)
                copy_us = copy_seconds(moved) * 1e6 if device == "cuda" else None
                for name, fn in runners(x).items():
                    if name == "reference" and (device == "cuda" or tokens > skip_reference_above):
                        continue
                    row = dict(impl=name, tokens=tokens, heads=heads, kv_cache_dtype=kv_cache_dtype, bytes=moved,
                               copy_us=copy_us)
                    if device == "cpu":
                        row.update(eager_us=time_cpu(fn) * 1e6, graph_us=None, host_us=None)
                    else:
                        eager, error = _timed(time_gpu, fn)
                        graph, graph_error = _timed(time_graph, fn)
                        host, _ = _timed(host_seconds, fn)
                        row.update(eager_us=eager and eager * 1e6, graph_us=graph and graph * 1e6,
                                   host_us=host and host * 1e6, error=error or graph_error)
                        if name not in ("fused", "unfused"):
                            row["differing_bytes"] = agreement(tokens, heads, kv_cache_dtype, device, name)
                    rows.append(row)
    return rows


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[dict], copy_rate: float | None = None) -> None:
    """One line per row: eager / graph / host microseconds, GB/s and the fraction of the same-size copy
    (both under graph replay), and the time over ours fused."""
    device, peak = peak_bandwidth()
    print(f"device: {device}; nominal peak HBM {'n/a' if peak is None else f'{peak / 1e12:.2f} TB/s'}"
          + ("" if copy_rate is None else f"; 1 GiB device copy {copy_rate / 1e12:.2f} TB/s (read + written)"))
    print("bytes moved: q_pe r+w, k_pe r+w, kv_c r, cache entry w, cos|sin row r, positions + slots r (bench_ops."
          "bytes_moved); 'of copy' = a copy moving the same bytes, graph time / this graph time")
    print(f"{'H':>4} {'cache':>5} {'T':>6} {'impl':>9} {'eager us':>9} {'graph us':>9} {'host us':>8} "
          f"{'GB/s':>7} {'of copy':>7} {'vs fused':>8}  notes")
    fused = {(r["heads"], r["kv_cache_dtype"], r["tokens"]): r for r in rows if r["impl"] == "fused"}
    for r in rows:
        base = fused[(r["heads"], r["kv_cache_dtype"], r["tokens"])]
        timed = r["graph_us"] if r["graph_us"] is not None else r["eager_us"]
        base_time = base["graph_us"] if base["graph_us"] is not None else base["eager_us"]
        speed = f"{r['bytes'] / (timed * 1e-6) / 1e9:.0f}" if timed and r["graph_us"] is not None else "-"
        of_copy = f"{100 * r['copy_us'] / timed:.0f}%" if timed and r["copy_us"] and r["graph_us"] else "-"
        ratio = f"{timed / base_time:.2f}x" if timed and base_time else "-"
        notes = r.get("error") or ""
        if r.get("differing_bytes") is not None:
            notes = (notes + " " if notes else "") + f"{r['differing_bytes']} bytes differ from fused"
        print(f"{r['heads']:>4} {r['kv_cache_dtype']:>5} {r['tokens']:>6} {r['impl']:>9} {_us(r['eager_us']):>9} "
              f"{_us(r['graph_us']):>9} {_us(r['host_us']):>8} {speed:>7} {of_copy:>7} {ratio:>8}  {notes}")


def print_summary(rows: list[dict]) -> None:
    """``summary:`` lines (ci/gpu.sh shows them): the smallest decode call, and per H and cache the
    fused op's share of a same-size copy at the largest T; the peer beside ours where it ran."""
    graphed = [r for r in rows if r["graph_us"] is not None]
    for r in sorted(graphed, key=lambda r: (r["tokens"], -r["heads"]))[:1]:
        for name in ("fused", "unfused", "flaggems"):
            row = next((x for x in graphed if x["impl"] == name and x["tokens"] == r["tokens"]
                        and x["heads"] == r["heads"] and x["kv_cache_dtype"] == r["kv_cache_dtype"]), None)
            if row:
                print(f"summary: {name} T={row['tokens']} H={row['heads']} {row['kv_cache_dtype']}: eager "
                      f"{_us(row['eager_us'])} us, graph {_us(row['graph_us'])} us, host {_us(row['host_us'])} us")
    largest = max((r["tokens"] for r in graphed), default=None)
    for name in ("fused", "flaggems"):
        shares = [f"H={r['heads']} {r['kv_cache_dtype']} {100 * r['copy_us'] / r['graph_us']:.0f}%" for r in graphed
                  if r["impl"] == name and r["tokens"] == largest and r["copy_us"]]
        if shares:
            print(f"summary: {name} at T={largest}, share of a same-size copy: {', '.join(shares)}")


def save(rows: list[dict], out_dir: str, copy_rate: float | None = None) -> None:
    os.makedirs(out_dir, exist_ok=True)
    device, peak = peak_bandwidth()
    versions = {"torch": torch.__version__, "triton": __import__("triton").__version__}
    with open(os.path.join(out_dir, "bench_mla.json"), "w") as f:
        json.dump({"device": device, "versions": versions, "peak_bytes_per_s": peak,
                   "copy_bytes_per_s": copy_rate, "rows": rows}, f, indent=1)
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
        for impl in ("fused", "unfused", "flaggems", "reference"):
            points = [(r["tokens"], r["graph_us"] if r["graph_us"] is not None else r["eager_us"]) for r in rows
                      if r["impl"] == impl and r["heads"] == heads and r["kv_cache_dtype"] == kv_cache_dtype
                      and (r["graph_us"] or r["eager_us"])]
            if points:
                ax.plot(*zip(*points), marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="tokens T", ylabel="microseconds (graph replay on a GPU)",
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
    rows = measure(tokens, heads, args.caches)
    copy_rate = copy_bandwidth() if on_gpu else None  # after the rows: the clocks are up by then
    print_table(rows, copy_rate)
    print_summary(rows)
    if args.out:
        save(rows, args.out, copy_rate)


if __name__ == "__main__":
    main()
