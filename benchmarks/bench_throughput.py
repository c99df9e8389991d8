"""Throughput of the conformance suite as one worker of a fuzzing campaign sees it (a benchmark, not a test).

1. ``properties``: examples per second per worker for every property of the suite
   (``mla_fuse_conformance.running.harness.all_properties()``) against each implementation named: one
   process, one torch thread (a campaign runs one worker per core), hypothesis generating
   ``--examples`` derandomized examples per property (no database, no shrinking: what a
   worker does between finds) after a short warm-up. Each property is run ``--repeats``
   times; the table shows the median and the best rate by wall clock and the median by
   process CPU time (less sensitive to other processes on a shared machine). On a CPU the
   default implementations are ``triton`` (the kernels, interpreted) and
   ``triton-cpu-fast`` (their vectorized torch twin); on a GPU, ``triton``. Case sizes are
   the suite's small ones on a CPU and its large ones on a GPU (as the ``gpu`` profile).

2. ``mla``: the cost of the fused MLA op at T=64, H=16, L=512, R=64, bf16, fp8 cache on a
   CPU: the interpreted kernel, the fast path and the float64 reference, each against
   ``eager_fused_mla`` (``benchmarks/bench_ops.py``: the same work as plain vectorized
   torch; bitwise equal to the kernel on these inputs, checked here before timing), and the
   floor the interpreter cannot go under: its element-by-element loads and stores of the
   elements the op must move, timed alone.

    python benchmarks/bench_throughput.py                         # both, every property
    python benchmarks/bench_throughput.py --only mla
    python benchmarks/bench_throughput.py --only properties --impl triton-cpu-fast --examples 50 --repeats 5
    python benchmarks/bench_throughput.py --json out.json         # the rows, for comparing runs
    python benchmarks/bench_throughput.py --only mla --upstream-helper-calls   # helpers as before InterpretedHelper

Figures and how to read them: docs/THROUGHPUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings

CPU_IMPLS = ("triton", "triton-cpu-fast")
MLA_SHAPE = dict(tokens=64, heads=16, kv_cache_dtype="fp8")


# ---------------------------------------------------------------- 1. examples per second per property


def load_properties(sizes: str) -> dict:
    """The suite's registered properties (their modules imported with the case sizes chosen)."""
    os.environ["MLA_FUSE_PROPERTY_SIZES"] = sizes
    from mla_fuse_conformance.running import harness

    return harness.all_properties()


def worker_settings(max_examples: int) -> settings:
    return settings(max_examples=max_examples, derandomize=True, database=None, phases=(Phase.generate,),
                    deadline=None, verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck))


def run_variant(prop, impl, device, strategy, max_examples: int) -> int:
    """Run one strategy of ``prop`` for up to ``max_examples`` generated examples; the number that ran."""
    ran = 0

    @worker_settings(max_examples)
    @given(case=strategy)
    def one_example(case):
        nonlocal ran
        prop.run(impl, device, case)
        ran += 1

    one_example()
    return ran


def time_property(prop, impl, device, examples: int) -> tuple[int, float, float]:
    """(examples run, wall seconds, CPU seconds) for ``examples`` spread over the property's strategies."""
    per_variant = -(-examples // len(prop.strategies))
    ran, wall, cpu = 0, time.perf_counter(), time.process_time()
    for strategy in prop.strategies:
        ran += run_variant(prop, impl, device, strategy, per_variant)
    return ran, time.perf_counter() - wall, time.process_time() - cpu


def measure_property(prop, impl, device, examples: int, repeats: int) -> dict:
    from mla_fuse_conformance.running.harness import NotProvided

    row = dict(property=prop.name, impl=impl.name, device=str(device))
    try:
        time_property(prop, impl, device, max(3, len(prop.strategies)))  # warm-up: first launches, imports
        runs = [time_property(prop, impl, device, examples) for _ in range(repeats)]
    except NotProvided as reason:
        return dict(row, skipped=str(reason))
    except AssertionError as error:  # a correct implementation never gets here; say so loudly
        return dict(row, failed=str(error).splitlines()[0])
    rates = [ran / wall for ran, wall, _ in runs]
    return dict(row, examples=runs[0][0], median_per_s=statistics.median(rates), best_per_s=max(rates),
                cpu_per_s=statistics.median(ran / cpu for ran, _, cpu in runs))


def measure_properties(impl_specs, device, examples: int, repeats: int, sizes: str, match: str) -> list[dict]:
    from mla_fuse_conformance.contract.implementation import load_implementation

    properties = load_properties(sizes)
    impls = [load_implementation(spec) for spec in impl_specs]
    rows = []
    for name in sorted(properties):  # implementations in turn per property: drifting load hits them alike
        if match in name:
            for impl in impls:
                rows.append(measure_property(properties[name], impl, device, examples, repeats))
                print_property_row(rows[-1], flush=True)
    return rows


def print_property_header() -> None:
    print(f"{'property':<62} {'impl':<16} {'examples':>8} {'median/s':>9} {'best/s':>8} {'cpu/s':>8}")


def print_property_row(row: dict, flush: bool = False) -> None:
    head = f"{row['property']:<62} {row['impl']:<16}"
    if "skipped" in row or "failed" in row:
        print(f"{head} {'FAILED: ' + row['failed'] if 'failed' in row else 'skipped'}", flush=flush)
        return
    print(f"{head} {row['examples']:>8} {row['median_per_s']:>9.2f} {row['best_per_s']:>8.2f} {row['cpu_per_s']:>8.2f}",
          flush=flush)


def print_speedups(rows: list[dict]) -> None:
    """Each implementation's rates over the first one's, per property (median wall, median CPU)."""
    rates = {(row["property"], row["impl"]): row for row in rows if "median_per_s" in row}
    impls = list(dict.fromkeys(row["impl"] for row in rows))
    for impl in impls[1:]:
        print(f"examples/s of {impl} / examples/s of {impls[0]}:  {'wall':>6} {'cpu':>6}")
        for name in dict.fromkeys(row["property"] for row in rows):
            if (name, impl) in rates and (name, impls[0]) in rates:
                fast, base = rates[name, impl], rates[name, impls[0]]
                print(f"  {name:<62} {fast['median_per_s'] / base['median_per_s']:5.2f}x "
                      f"{fast['cpu_per_s'] / base['cpu_per_s']:5.2f}x")


# ---------------------------------------------------------------- 2. the fused MLA op: interpreter vs eager


def mla_runners() -> dict:
    """No-argument callables doing the fused op's work, each on its own inputs."""
    import bench_ops as bench  # beside this script
    from mla_fuse_conformance.adapters import triton_cpu_fast

    inputs = {name: bench.make_inputs(device="cpu", **MLA_SHAPE) for name in ("kernel", "fast", "reference", "eager")}
    one_token = bench.make_inputs(tokens=1, heads=1, kv_cache_dtype="fp8", device="cpu")
    return {"kernel": bench.runners(inputs["kernel"])["fused"],
            "kernel at T=1, H=1 (fixed cost)": bench.runners(one_token)["fused"],
            "fast": lambda: triton_cpu_fast.concat_and_cache_mla_rope_fused(**inputs["fast"]),
            "reference": bench.runners(inputs["reference"])["reference"],
            "eager": lambda: bench.eager_fused_mla(**inputs["eager"])}


def check_same_work() -> None:
    """The eager version and the fast path leave the kernel's bits on the benchmark's inputs."""
    from mla_fuse import ops
    import bench_ops as bench  # beside this script
    from mla_fuse_conformance.adapters import triton_cpu_fast

    runs = {name: bench.make_inputs(device="cpu", **MLA_SHAPE) for name in ("kernel", "eager", "fast")}
    ops.concat_and_cache_mla_rope_fused(**runs["kernel"])
    bench.eager_fused_mla(**runs["eager"])
    triton_cpu_fast.concat_and_cache_mla_rope_fused(**runs["fast"])
    for name in ("eager", "fast"):
        for arg in ("q_pe", "k_pe", "kv_cache"):
            if not torch.equal(runs[name][arg].view(torch.uint8), runs["kernel"][arg].view(torch.uint8)):
                raise SystemExit(f"{name} and the kernel wrote different {arg}: the comparison would be meaningless")


def interpreter_memory_floor(repeats: int, clock) -> float | None:
    """Seconds Triton's interpreter spends in its element-by-element load and store routines
    for the elements the fused op moves (``elements_moved``), with nothing else: a lower bound
    on the interpreted op. None when that routine cannot be reached (another Triton version)."""
    try:
        import numpy as np
        from triton._C.libtriton import interpreter
    except ImportError:
        return None
    from bench_ops import fastest_interleaved  # beside this script

    loads, stores = elements_moved(**MLA_SHAPE)
    scratch = torch.zeros(max(loads, stores), dtype=torch.bfloat16)
    pointers = scratch.data_ptr() + 2 * np.arange(scratch.numel(), dtype=np.uint64)
    mask, other = np.ones(scratch.numel(), dtype=bool), np.zeros(scratch.numel(), dtype=np.uint16)

    def move():
        values = interpreter.load(pointers[:loads], mask[:loads], other[:loads], np.dtype(np.uint16))
        interpreter.store(pointers[:stores], np.resize(values, stores), mask[:stores])

    return fastest_interleaved({"move": move}, repeats, clock=clock)["move"]


def elements_moved(tokens: int, heads: int, kv_cache_dtype: str, latent: int = 512, rotary: int = 64) -> tuple:
    """(elements loaded, elements stored) by the fused kernel:

        loads   positions T + slots T + cos|sin T*R + q_pe T*H*R + k_pe T*R + kv_c T*L
        stores  q_pe T*H*R + k_pe T*R + cache entries T*(L + R)
    """
    loads = 2 * tokens + tokens * rotary + tokens * heads * rotary + tokens * rotary + tokens * latent
    stores = tokens * heads * rotary + tokens * rotary + tokens * (latent + rotary)
    return loads, stores


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def measure_mla(repeats: int) -> dict:
    """{clock: {what: seconds per call}} for the wall clock and this process's CPU time."""
    from bench_ops import fastest_interleaved  # beside this script

    check_same_work()
    result = {}
    for clock_name, clock in CLOCKS.items():
        result[clock_name] = fastest_interleaved(mla_runners(), repeats, clock=clock)
        result[clock_name]["interpreter memory ops alone"] = interpreter_memory_floor(repeats, clock)
    return result


def print_mla(result: dict) -> None:
    loads, stores = elements_moved(**MLA_SHAPE)
    print(f"fused MLA op, T=64 H=16 L=512 R=64 bf16 fp8 cache, 1 torch thread, fastest call of interleaved runs "
          f"({loads} elements loaded, {stores} stored):")
    print(f"  {'':<30} {'wall ms':>9} {'x eager':>8} {'cpu ms':>9} {'x eager':>8}")
    wall, cpu = result["wall"], result["cpu"]
    for name in wall:
        cells = [f"{s[name] * 1e3:9.3f} {s[name] / s['eager']:7.1f}x" if s[name] is not None else f"{'n/a':>18}"
                 for s in (wall, cpu)]
        print(f"  {name:<30} {cells[0]} {cells[1]}")


# ---------------------------------------------------------------- main


def use_upstream_helper_calls() -> None:
    """Undo mla_fuse.kernels.InterpretedHelper's one change, for before/after figures."""
    from triton.runtime.interpreter import InterpretedFunction

    from mla_fuse.kernels import InterpretedHelper

    InterpretedHelper.__call__ = InterpretedFunction.__call__


def machine() -> str:
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU (Triton interpreter)"
    return (f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, {device}; load average "
            f"{load}; torch {torch.__version__}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["properties", "mla"], help="one of the two measurements")
    parser.add_argument("--impl", nargs="+",
                        help="implementations (default: triton triton-cpu-fast on CPU, triton on GPU)")
    parser.add_argument("--examples", type=int, default=30, help="examples per property per run (default 30)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per property (default 3)")
    parser.add_argument("--match", default="", help="only properties whose name contains this")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--upstream-helper-calls", action="store_true",
                        help="interpreted @jit helpers re-patch triton.language on every call, as Triton's own "
                             "InterpretedFunction does (the 'before' of docs/THROUGHPUT.md)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.upstream_helper_calls:
        use_upstream_helper_calls()
    from mla_fuse_conformance.running.devices import select_device

    device = select_device()
    on_gpu = device.type == "cuda"
    print(machine())
    result = {"machine": machine(), "device": str(device)}
    if args.only != "mla":
        print_property_header()
        result["properties"] = measure_properties(args.impl or (("triton",) if on_gpu else CPU_IMPLS), device,
                                                  args.examples, args.repeats, "large" if on_gpu else "small",
                                                  args.match)
        print_speedups(result["properties"])
    if args.only != "properties" and not on_gpu:
        result["mla_seconds"] = measure_mla(max(3, args.repeats))
        print_mla(result["mla_seconds"])
    print(f"load average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
