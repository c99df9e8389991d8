"""What one compiled step of a DeepSeek-like model costs, per engine cache layout (not a test;
nothing here is asserted).

A 3-layer model of DeepSeek-V2/V3 MLA layers (the native DeepSeek-scaling rope, as a serving
engine compiles it: ``backend="inductor"``, the token count marked dynamic) is compiled at O1
(no fusion) and O2 (RoPE + cache write fused), once per level: the caches never enter the
graph, so one graph serves every layout. For each layout of ``engine_caches.ENGINE_LAYOUTS``
it runs a warm-up step and then reports, for one step:

* ``allocated``: bytes allocated by the ops the step runs (torch.profiler, ``profile_memory``),
  absolute and as a share of the cache's bytes (``cache = 3 layers x NB x B x (L + R) x 2 B``),
  and ``growth``: how many more bytes the same step allocates with a cache of ``2 NB`` blocks,
  as a share of the bytes the cache grew by (a copy of the cache per step shows as >= 100%);
* ``launches``: device kernels per step. On a GPU, the CUDA kernels the profiler sees. On a
  CPU, the kernels that would be device kernels: mla_fuse's Triton launches (counted at the
  ``mla_fuse.ops`` entry points; they run in Triton's interpreter here) plus Inductor's
  generated kernels (``cpp_fused_*``, recorded with ``cpp.enable_kernel_profile``) plus the
  extern ATen calls of the compiled wrapper (``mm`` and the like);
* ``step ms``: the median of ``--repeat`` timed steps, on a GPU only (on a CPU the interpreter's
  time says nothing about a kernel).

``--design arguments`` reproduces the design this project had before caches were fetched at run
time: the layer hands its cache to the graph as a mutated argument (the copy-free mutant of the
pass mutation self-test), so functionalization copies aliased caches.

    python benchmarks/bench_compile.py [--blocks 4096] [--tokens 8] [--design fetched|arguments]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import mla_fuse.compile as mc
from mla_fuse.layers import set_forward_context
from mla_fuse_conformance.cases.engine_caches import ENGINE_LAYOUTS, build_caches
from mla_fuse_conformance.running.devices import allocated_bytes
from mla_fuse_conformance.compile_passes.inspection import counting_kernel_calls
from mla_fuse_conformance.compile_passes.models import build_model, make_step, MlaGeometry, ModelSpec

MODEL = ModelSpec(("mla",) * 3, ("plain",) * 3, hidden=256, rope="deepseek_native",
                  mla=MlaGeometry(heads=8, nope=32, rope_dim=32, latent=128, v_dim=32))
BLOCK_SIZE = 16


def _design(name: str):
    if name == "fetched":
        return contextlib.nullcontext()
    from mla_fuse_conformance.compile_passes.mutants import PASS_MUTANTS
    return PASS_MUTANTS["caches_enter_the_graph"].active()


def _step(compiled, caches, step):
    positions, hidden = step.positions.clone(), step.hidden.clone()
    torch._dynamo.mark_dynamic(positions, 0)
    torch._dynamo.mark_dynamic(hidden, 0)
    with torch.no_grad(), set_forward_context(caches.layers, step.slot_mapping):
        return compiled(positions, hidden)


def _launches(compiled, caches, step) -> int:
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with counting_kernel_calls() as ours, profile(activities=activities) as prof:
        _step(compiled, caches, step)
    events = prof.events()
    if cuda:
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    generated = sum(1 for e in events if "cpp_fused" in e.name)
    extern = sum(1 for e in events if e.name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::index"))
    return sum(ours.values()) + generated + extern


def _step_ms(compiled, caches, step, repeat: int) -> float | None:
    if not torch.cuda.is_available():
        return None
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        start = time.perf_counter()
        _step(compiled, caches, step)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bench(level: int, args) -> list[dict]:
    torch._dynamo.reset()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(MODEL).to(device)
    compiled = mc.compile(model, backend="inductor", level=level)
    step = make_step(MODEL, args.tokens, args.blocks * BLOCK_SIZE, seed=1)
    step.positions, step.hidden = step.positions.to(device), step.hidden.to(device)
    step.slot_mapping = {k: v.to(device) for k, v in step.slot_mapping.items()}
    rows = []
    for layout_name, layout in ENGINE_LAYOUTS.items():
        caches, grown = (build_caches(MODEL.cache_specs(), layout, blocks=blocks, block_size=BLOCK_SIZE,
                                      dtype=MODEL.torch_dtype, device=device)
                         for blocks in (args.blocks, 2 * args.blocks))
        allocated = []
        for each in (caches, grown):
            _step(compiled, each, step)  # warm-up (compiles on the first layout, and per cache shape if in the graph)
            allocated.append(allocated_bytes(lambda: _step(compiled, each, step), device))
        rows.append(dict(level=level, layout=layout_name, allocated=allocated[0],
                         share=allocated[0] / caches.cache_bytes, cache=caches.cache_bytes,
                         growth=(allocated[1] - allocated[0]) / (grown.cache_bytes - caches.cache_bytes),
                         launches=_launches(compiled, caches, step), ms=_step_ms(compiled, caches, step, args.repeat),
                         graphs=len(mc.graph_records(compiled)), fused=mc.match_counts(compiled).get(
                             "mla_rope_kvcache_fusion", 0)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=4096, help="NB, blocks per layer (B = 16)")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--design", choices=("fetched", "arguments"), default="fetched")
    args = parser.parse_args()
    torch._inductor.config.cpp.enable_kernel_profile = True
    with _design(args.design):
        rows = [row for level in (1, 2) for row in bench(level, args)]
    print(f"design: caches {args.design}; model: 3 MLA layers H={MODEL.mla.heads} L={MODEL.mla.latent} "
          f"R={MODEL.mla.rope_dim} bf16, T={args.tokens} (dynamic), NB={args.blocks} B={BLOCK_SIZE}")
    print(f"cache: {rows[0]['cache']} bytes")
    print(f"{'level':5} {'layout':18} {'allocated B':>12} {'of cache':>9} {'growth':>8} {'launches':>8} {'step ms':>8} "
          f"{'graphs':>6} {'fused':>5}")
    for row in rows:
        ms = f"{row['ms']:.3f}" if row["ms"] is not None else "-"
        print(f"O{row['level']:<4} {row['layout']:18} {row['allocated']:12d} {100 * row['share']:8.2f}% "
              f"{100 * row['growth']:7.1f}% {row['launches']:8d} {ms:>8} {row['graphs']:6d} {row['fused']:5d}")


if __name__ == "__main__":
    main()
