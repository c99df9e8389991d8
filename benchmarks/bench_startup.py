"""What the passes cost at start-up: compile-and-first-step time, cold and warm, per level and depth
(not a test, not in CI; nothing here is asserted). See docs/STARTUP.md.

The model is a decoder built from the public layers, as a user builds one: pre-norm blocks
``x += attn(norm(x)); x += mlp(norm(x))`` (SiLU-gated MLP), MLA layers with the native DeepSeek
YaRN rope (``DeepseekScalingRotaryEmbedding``, ``use_custom_op=False``), MHA layers with the native
plain rope, ``hybrid`` = MLA and MHA layers alternating. Widths are small so compile time, not
math, dominates (``WIDTHS``): hidden 64, MLP 128; MLA 2 heads, nope 16, rope 16, latent 32, v 16;
MHA 2 heads, 1 KV head, head size 32; bf16, auto caches of 4 blocks of 16, 4 tokens.

One measurement = one fresh ``python`` subprocess: build the model, ``mc.compile(model, level=L,
backend="inductor")``, mark the token count dynamic, run the first step under ``no_grad`` and
time ``compile + first step`` (``time.perf_counter`` around the first call; dynamo compiles
lazily there). Parts of that time, read from the process after the step:

* ``setup_s``: the fusion passes' set-up (pattern tracing and registration;
  ``torch._dynamo.utils.compilation_time_metrics["mla_fuse.pattern_setup"]``),
* ``match_s``: the fusion passes' matching and replacement (``"mla_fuse.pattern_match"``),
* ``passes_s``: all of the post-grad custom pass (``"mla_fuse.passes"``: the two above, the
  utility passes, defunctionalization, the manager's clean-up and graph copy),
* ``rest_s``: ``total_s - passes_s`` (dynamo, AOT autograd, Inductor's own passes, code
  generation, C++ compile, the step itself);
* ``step_s``: a second step, timed the same way (no compile). On a CPU the mla_fuse kernels run in
  Triton's interpreter, so a step is not free here: compile time is about ``total_s - step_s``.

Wall time is what an engine's start-up waits for, and on a loaded machine it is mostly waiting:
each row also has ``cpu_s`` (CPU time of the child's own threads over the first call) and
``process_cpu_s`` (CPU time of the whole child process and the processes it waited for, C++
compilers included, import and model build included), which load from other users affects less,
and the machine's 1-minute load average when the row was written.

Each repeat and level gets a fresh, empty ``TORCHINDUCTOR_CACHE_DIR`` (Inductor's FX graph cache
and its C++/kernel caches; ``TRITON_CACHE_DIR`` inside it). ``--mode cold``: one subprocess on the
empty directory. ``--mode warm``: a second subprocess on the directory the first filled (FX graph
cache hit: Inductor runs no pass); the first is not recorded. ``--mode both`` (default) records
both. ``--level 1 2`` alternates the levels inside each repeat (L1, L2, L1, L2, ...), so load from
other users of the machine falls on both alike.

    python benchmarks/bench_startup.py --kind mla --layers 61 --level 1 2 --mode both --repeat 3
    python benchmarks/bench_startup.py --report               # table (+ plot if matplotlib is there)

``--backend light --mode cold``: Inductor's graph passes (ours included) without code generation
or a cache, to see the passes' share alone; every row also counts the fusion passes' traces
(``patterns_traced``: patterns set up; ``recheck_traces``/``recheck_copies``: torch's exact
re-check of a match traced, or copied from an earlier match of the same shapes).

Results are appended to ``benchmarks/results/startup.jsonl`` (``--out``), one JSON object a line.
``--fusion mla|mha|both`` turns on one fusion only at level 2 (level 1 stays level 1, no fusion):
a model no pass can match is an MHA stack with ``--fusion mla``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).parent / "results" / "startup.jsonl"
WIDTHS = dict(hidden=64, mlp=128, mla_heads=2, nope=16, rope=16, latent=32, v_dim=16,
              mha_heads=2, mha_kv_heads=1, head_size=32, blocks=4, block_size=16, tokens=4)
TIMERS = {"setup_s": "mla_fuse.pattern_setup", "match_s": "mla_fuse.pattern_match", "passes_s": "mla_fuse.passes"}


# ------------------------------------------------------------------ the model (child process)


def build_model(kind: str, num_layers: int):
    import torch
    from torch import nn

    from mla_fuse.layers import DeepseekScalingRotaryEmbedding, MHAAttention, MLAAttention, RMSNorm, RotaryEmbedding

    w = WIDTHS

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up = nn.Linear(w["hidden"], 2 * w["mlp"], bias=False)
            self.down = nn.Linear(w["mlp"], w["hidden"], bias=False)

        def forward(self, x):
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(nn.functional.silu(gate) * up)

    def attention(layer_kind: str, name: str) -> nn.Module:
        if layer_kind == "mla":
            rope = DeepseekScalingRotaryEmbedding(w["rope"], w["rope"], 256, 10000.0, False, 4.0,
                                                  use_custom_op=False)
            return MLAAttention(w["hidden"], w["mla_heads"], w["nope"], w["rope"], w["v_dim"], w["latent"], rope, name)
        rope = RotaryEmbedding(w["head_size"], w["head_size"], 256, 10000.0, True, use_custom_op=False)
        return MHAAttention(w["hidden"], w["mha_heads"], w["mha_kv_heads"], w["head_size"], rope, name)

    class Block(nn.Module):
        def __init__(self, layer_kind: str, name: str) -> None:
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(w["hidden"]), RMSNorm(w["hidden"])
            self.attn, self.mlp = attention(layer_kind, name), MLP()

        def forward(self, positions, x):
            x = x + self.attn(positions, self.attn_norm(x))
            return x + self.mlp(self.mlp_norm(x))

    class Decoder(nn.Module):
        def __init__(self, kinds: list[str]) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Block(k, f"model.layers.{i}.attn") for i, k in enumerate(kinds))
            self.norm = RMSNorm(w["hidden"])

        def forward(self, positions, x):
            for layer in self.layers:
                x = layer(positions, x)
            return self.norm(x)

    kinds = layer_kinds(kind, num_layers)
    torch.manual_seed(0)
    return Decoder(kinds).to(torch.bfloat16), kinds


def layer_kinds(kind: str, num_layers: int) -> list[str]:
    if kind == "hybrid":
        return ["mla" if i % 2 == 0 else "mha" for i in range(num_layers)]
    return [kind] * num_layers


def caches_and_step(kinds: list[str]):
    import torch

    from mla_fuse.layers import LayerKVCache

    w, dtype = WIDTHS, torch.bfloat16
    nb, b, t = w["blocks"], w["block_size"], w["tokens"]
    caches, slots = {}, {}
    for i, k in enumerate(kinds):
        name = f"model.layers.{i}.attn"
        if k == "mla":
            caches[name] = LayerKVCache("auto", kv_cache=torch.zeros(nb, b, w["latent"] + w["rope"], dtype=dtype))
        else:
            shape = (nb, b, w["mha_kv_heads"], w["head_size"])
            caches[name] = LayerKVCache("auto", key_cache=torch.zeros(shape, dtype=dtype),
                                        value_cache=torch.zeros(shape, dtype=dtype))
        slots[name] = torch.arange(t, dtype=torch.int64)
    positions = torch.arange(t, dtype=torch.int64)
    hidden = torch.randn(t, w["hidden"], dtype=dtype)
    return caches, slots, positions, hidden


def measure(kind: str, num_layers: int, level: int, fusion: str, backend: str = "inductor") -> dict:
    """Compile and run the first step in this process; the time, its parts, and how many traces the
    fusion passes made (patterns set up; the exact re-check of a match: traced, or a copy of an
    earlier trace with another layer name)."""
    import torch
    from torch._dynamo.utils import compilation_time_metrics

    import mla_fuse.compile as mc
    from mla_fuse.layers import set_forward_context

    torch.set_grad_enabled(False)
    model, kinds = build_model(kind, num_layers)
    caches, slots, positions, hidden = caches_and_step(kinds)
    flags = {} if fusion == "both" or level < 2 else {"fuse_mla_rope_kvcache": fusion == "mla",
                                                      "fuse_rope_kvcache": fusion == "mha"}
    compiled = mc.compile(model, level=level, backend=backend, **flags)
    torch._dynamo.mark_dynamic(positions, 0)
    torch._dynamo.mark_dynamic(hidden, 0)
    start, start_cpu = time.perf_counter(), time.process_time()
    with set_forward_context(caches, slot_mapping=slots):
        compiled(positions, hidden)
    total, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    start, start_cpu = time.perf_counter(), time.process_time()
    with set_forward_context(caches, slot_mapping=slots):
        compiled(positions, hidden)  # the second step: no compile; on a CPU the kernels run in Triton's interpreter
    step, step_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    parts = {key: sum(compilation_time_metrics.get(name, [])) for key, name in TIMERS.items()}
    records = mc.graph_records(compiled)
    from mla_fuse.passes import pattern_utils
    traces = {"patterns_traced": pattern_utils.traced_pattern_count()}
    if hasattr(pattern_utils, "MatchTraces"):  # absent before the re-check memo (docs/STARTUP.md): measure older commits too
        traces.update(recheck_traces=pattern_utils.MatchTraces.misses, recheck_copies=pattern_utils.MatchTraces.hits)
    return {"total_s": total, "cpu_s": cpu, "step_s": step, "step_cpu_s": step_cpu, **parts, "rest_s": total - parts["passes_s"], "graphs": len(records),
            "cache_hits": mc.cache_hits(compiled), "counts": mc.match_counts(compiled), **traces}


# ------------------------------------------------------------------ the driver (parent process)


def run_child(args, level: int, cache_dir: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir, "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton")}
    command = [sys.executable, __file__, "--child", "--kind", args.kind, "--layers", str(args.layers),
               "--level", str(level), "--fusion", args.fusion, "--backend", args.backend]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"bench_startup child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result


def drive(args) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()} {os.cpu_count()} cores"
    modes = ("cold", "warm") if args.mode == "both" else (args.mode,)
    for repeat in range(args.repeat):
        for level in args.level:
            with tempfile.TemporaryDirectory(prefix="bench_startup_") as cache_dir:
                for mode in ("cold", "warm") if "warm" in modes else modes:
                    result = run_child(args, level, cache_dir)  # cold: empty cache dir; warm: the cold run's
                    if mode in modes:
                        _record(args, machine, level, mode, repeat, result)


def _record(args, machine: str, level: int, mode: str, repeat: int, result: dict) -> None:
    row = {"kind": args.kind, "layers": args.layers, "level": level, "fusion": args.fusion, "mode": mode,
           "backend": args.backend,
           "repeat": repeat, "load": os.getloadavg()[0], "machine": machine, "commit": _commit(),
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **result}
    with args.out.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(f"{args.kind:6s} {args.layers:3d} L{level} {args.fusion:4s} {mode:4s} #{repeat}: "
          f"{result['total_s']:7.2f} s (setup {result['setup_s']:.2f}, match {result['match_s']:.2f}, "
          f"passes {result['passes_s']:.2f}; traces {result.get('patterns_traced')} set-up, "
          f"{result.get('recheck_traces')} re-check, {result.get('recheck_copies')} copies) graphs {result['graphs']} hits {result['cache_hits']} "
          f"load {row['load']:.1f} {result['counts']}", flush=True)


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent, check=False)
    return done.stdout.strip()


# ------------------------------------------------------------------ the report


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]"


def report(path: Path, plot: Path | None) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for row in rows:
        key = (row["kind"], row["fusion"], row["mode"], row["layers"], row.get("backend", "inductor"))
        groups.setdefault(key, {}).setdefault(row["level"], []).append(row)
    print("wall s and cpu s (the child's first call): median [min-max] over n repeats per level (cpu: the rows "
          "that have it); "
          "L2-L1: difference of medians; setup/match/passes: L2 medians, s; load: median 1-min load average")
    print(f"{'kind':6s} {'fusion':6s} {'mode':4s} {'layers':>6s} {'backend':8s} | {'L1 wall s':>20s} | {'L2 wall s':>20s} | "
          f"{'L2-L1':>6s} {'%':>6s} | {'L1 cpu s':>20s} | {'L2 cpu s':>20s} | {'L2-L1':>6s} | "
          f"{'setup':>5s} {'match':>5s} {'passes':>6s} | {'load':>4s} | n")
    for key in sorted(groups, key=lambda k: (k[4], k[0], k[1], k[2], k[3])):
        by_level = groups[key]
        if 1 not in by_level or 2 not in by_level:
            continue
        walls = {level: [r["total_s"] for r in by_level[level]] for level in (1, 2)}
        cpus = {level: [r["cpu_s"] for r in by_level[level] if "cpu_s" in r] for level in (1, 2)}  # older rows: none
        delta = statistics.median(walls[2]) - statistics.median(walls[1])
        delta_cpu = statistics.median(cpus[2]) - statistics.median(cpus[1]) if cpus[1] and cpus[2] else float("nan")

        def med(part):
            return statistics.median(r[part] for r in by_level[2])
        load = statistics.median(r["load"] for level in (1, 2) for r in by_level[level])
        print(f"{key[0]:6s} {key[1]:6s} {key[2]:4s} {key[3]:6d} {key[4]:8s} | {_spread(walls[1]):>20s} | {_spread(walls[2]):>20s} | "
              f"{delta:+6.2f} {100 * delta / statistics.median(walls[1]):+5.1f}% | {_spread(cpus[1]):>20s} | "
              f"{_spread(cpus[2]):>20s} | {delta_cpu:+6.2f} | {med('setup_s'):5.2f} {med('match_s'):5.2f} "
              f"{med('passes_s'):6.2f} | {load:4.1f} | {len(walls[1])}/{len(walls[2])}")
        steps = {level: [r["step_s"] for r in by_level[level] if "step_s" in r] for level in (1, 2)}
        if steps[1] and steps[2]:
            compiles = {level: [r["total_s"] - r["step_s"] for r in by_level[level] if "step_s" in r] for level in (1, 2)}
            compile_delta = statistics.median(compiles[2]) - statistics.median(compiles[1])
            print(f"{'':36s}   second step, wall s: L1 {_spread(steps[1])}, L2 {_spread(steps[2])}; "
                  f"first call - second step: L1 {_spread(compiles[1])}, L2 {_spread(compiles[2])}, "
                  f"L2-L1 {compile_delta:+.2f}")
    if plot is not None:
        _plot(groups, plot)


def _plot(groups, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode, style in (("cold", "-"), ("warm", "--")):
        for level, marker in ((1, "o"), (2, "s")):
            points = sorted((k[3], statistics.median(r["total_s"] for r in v[level]))
                            for k, v in groups.items()
                            if k[:3] == ("mla", "both", mode) and k[4] == "inductor" and level in v)
            if points:
                ax.plot(*zip(*points), style, marker=marker, label=f"MLA {mode} L{level}")
    ax.set_xlabel("layers")
    ax.set_ylabel("compile + first step, s (median)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("mla", "mha", "hybrid"), default="mla")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--level", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--fusion", choices=("both", "mla", "mha"), default="both")
    parser.add_argument("--mode", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--backend", choices=("inductor", "light"), default="inductor",
                        help="light: Inductor's graph passes, ours included, without code generation")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--report", action="store_true", help="print the table of --out (and plot it)")
    parser.add_argument("--plot", type=Path, default=None, help="with --report: where to save the plot (png)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.kind, args.layers, args.level[0], args.fusion, args.backend)))
    elif args.report:
        report(args.out, args.plot)
    else:
        drive(args)


if __name__ == "__main__":
    main()
