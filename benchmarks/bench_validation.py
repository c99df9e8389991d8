"""What an eager call costs on the host: the argument checks, the dispatch, and (``--launch``) the launch.

Every call of an operation runs its sync-free checks in the op's body (ranks, sizes, dtypes,
strides, devices, and the overlap of written buffers, from metadata). This script times, per
call, for each operation at a decode and a prefill size (DeepSeek-V3 MLA with 16 local heads,
L = 512, R = 64, bf16, fp8 cache; an MHA layer with H = 32, Hkv = 8, D = 128):

  new       ``validation.check_<op>`` on a layout it has not seen (``layouts.forget_layouts()`` first):
            every sync-free check runs
  layer     ``validation.check_<op>`` on a layout whose shapes it passed at other addresses (in
            an engine the layers of a step after the first, each with its own cache; here
            each of 60 calls gets its own ``slot_mapping``, or ``positions``, tensor): the overlap
            check alone runs
  same      ``validation.check_<op>`` on a layout it passed before: what a serving loop pays
            per call once its buffers are known (building the key of the layout)
  bare      ``torch.ops.mla_fuse.<op>`` with the checks and the kernel launch replaced by no-ops:
            what the dispatcher costs for this op without any check
  op        ``torch.ops.mla_fuse.<op>`` with the checks and no launch: ``bare`` + ``same``
  wrapper   ``mla_fuse.ops.<op>`` with no launch: ``op`` + the wrapper's argument-type check
  values    ``validation.check_<op>(check_values=True)``: every check and the opt-in value checks
            (one device sync)

as the calling thread's CPU time per call (the least of ``--repeats`` runs), and prints the
checks' share of the host time of a call without its launch: ``same / op``, and
``new / (bare + new)`` for a first call.

``--launch`` adds the real calls, launches included, of the fused MLA op at T=1, H=128 (a decode
step of DeepSeek-V3 with all 128 heads on one GPU): ``torch.ops.mla_fuse.<op>``,
``mla_fuse.ops.<op>`` (a known layout: its plan's kept launch, ``launcher.Plan``), the same
``torch.ops`` call with a launch hook registered (the kept launch then calls Triton's runner,
which builds the hooks' launch metadata; without a hook it calls the C launcher itself), through
the launcher's table with no kept launch (the plan reused, the
table's key, the fp8 view and tensors for the C launcher built each call), and with every launch
through Triton's ``JITFunction.run`` (the kernel's
``launcher.Launcher`` table kept empty, so no plan keeps a launch: what a call cost before them),
and two trivial ops for scale (an empty op of the same schema, and ``aten.add_`` on a one-element
tensor), as host CPU time and wall time per call of a loop of calls (the wall time of a
run ends with a device sync; at T=1 the host, not the GPU, sets the pace). On a GPU that is the
eager cost to compare with the kernel's few microseconds, and the functions a ``torch.ops`` call
spends its host time in follow (``cProfile`` of 2000 calls, by own time; cProfile inflates Python
code against C, so read it for where the time goes, not for totals). On a CPU the launch is
Triton's interpreter running the kernel, fewer calls are timed, and there is no table.

    python benchmarks/bench_validation.py [--device cuda] [--repeats 7] [--launch]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time
import timeit

import torch

from mla_fuse import layouts, ops, validation
from mla_fuse.kernels import config, flash_cache, flash_rope_cache, mla_cache, mla_rope_cache
from mla_fuse.kernels import rotary_embedding as rope_kernel

LAUNCHERS = {"rotary_embedding": rope_kernel, "concat_and_cache_mla": mla_cache,
             "concat_and_cache_mla_rope_fused": mla_rope_cache, "reshape_and_cache_flash": flash_cache,
             "rope_and_reshape_and_cache_flash": flash_rope_cache}


def mla_args(tokens: int, device: str, heads: int = 16) -> dict:
    """DeepSeek-V3 MLA, 16 heads per rank: q [T, H, 128 + 64] (q_pe its slice), kv [T, 512 + 64]."""
    nope, latent, rotary, blocks, block_size = 128, 512, 64, 4096, 64
    q = torch.randn(tokens, heads, nope + rotary, device=device).bfloat16()
    kv = torch.randn(tokens, latent + rotary, device=device).bfloat16()
    return dict(positions=torch.arange(tokens, device=device), q_pe=q[..., nope:], k_pe=kv[:, latent:],
                kv_c=kv[:, :latent], cos_sin_cache=torch.randn(163840, rotary, device=device), is_neox=False,
                slot_mapping=torch.arange(tokens, device=device),
                kv_cache=torch.zeros(blocks, block_size, latent + rotary, dtype=torch.uint8, device=device),
                kv_cache_dtype="fp8", kv_cache_scale=torch.ones(1, device=device))


def flash_args(tokens: int, device: str) -> dict:
    """MHA: packed qkv [T, (32 + 2 * 8) * 128]; K and V caches interleaved in one pool."""
    heads, kv_heads, head_size, blocks, block_size = 32, 8, 128, 2048, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_size, device=device).bfloat16()
    query, key, value = qkv.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], dim=1)
    pool = torch.zeros(blocks, block_size, 2, kv_heads, head_size, dtype=torch.bfloat16, device=device)
    return dict(positions=torch.arange(tokens, device=device), query=query.view(tokens, heads, head_size),
                key=key.view(tokens, kv_heads, head_size), value=value.view(tokens, kv_heads, head_size),
                key_cache=pool[:, :, 0], value_cache=pool[:, :, 1], slot_mapping=torch.arange(tokens, device=device),
                cos_sin_cache=torch.randn(131072, head_size, device=device), is_neox=True, kv_cache_dtype="auto",
                k_scale=torch.ones(1, device=device), v_scale=torch.ones(1, device=device))


def arguments(operation: str, tokens: int, device: str) -> dict:
    mla, flash = mla_args(tokens, device), flash_args(tokens, device)
    pick = {
        "rotary_embedding": lambda: dict(positions=flash["positions"], query=flash["query"], key=flash["key"],
                                         head_size=128, cos_sin_cache=flash["cos_sin_cache"], is_neox=True),
        "concat_and_cache_mla": lambda: dict(kv_c=mla["kv_c"], k_pe=mla["k_pe"], kv_cache=mla["kv_cache"],
                                             slot_mapping=mla["slot_mapping"], kv_cache_dtype="fp8",
                                             scale=mla["kv_cache_scale"]),
        "concat_and_cache_mla_rope_fused": lambda: mla,
        "reshape_and_cache_flash": lambda: {name: flash[name] for name in (
            "key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale")},
        "rope_and_reshape_and_cache_flash": lambda: flash,
    }
    return pick[operation]()


@contextlib.contextmanager
def replaced(holder, name: str, replacement, entry: bool = False):
    """``holder.name`` (with ``entry``: ``holder[name]``) replaced for the duration."""
    get, put = (holder.__getitem__, holder.__setitem__) if entry else (
        lambda key: getattr(holder, key), lambda key, value: setattr(holder, key, value))
    original = get(name)
    put(name, replacement)
    try:
        yield
    finally:
        put(name, original)


def per_call_us(function, repeats: int, device: str, number: int = 300) -> float:
    """The least over ``repeats`` runs of ``number`` calls of the mean CPU time of the calling thread
    per call, in microseconds (CPU time, not wall time: other processes on a shared machine
    delay a call without adding to it; the least run is the one they disturbed least)."""
    function()  # warm up (compiles a kernel on the first real launch)
    if device == "cuda":
        torch.cuda.synchronize()
    times = timeit.repeat(function, timer=time.thread_time, number=number, repeat=repeats)
    if device == "cuda":
        torch.cuda.synchronize()
    return min(times) / number * 1e6


LAYERS = 60  # the layers of a step after its first (DeepSeek-V3 has 61)


def measure(operation: str, tokens: int, device: str, repeats: int) -> dict:
    args = arguments(operation, tokens, device)
    values = list(args.values())
    check = validation.CHECKERS[operation]
    op = getattr(torch.ops.mla_fuse, operation).default
    wrapper = getattr(ops, operation)

    def first_time():
        layouts.forget_layouts()
        check(*values)

    # the same shapes at other addresses (in an engine another layer's cache; here another slot_mapping,
    # or positions for the op without one)
    moved = "slot_mapping" if "slot_mapping" in args else "positions"
    layers = [[v.clone() if name == moved else v for name, v in args.items()] for _ in range(LAYERS)]

    def each_layer():  # the first layer's call passes the shapes, the others are timed
        layouts.forget_layouts()
        check(*values)
        start = time.thread_time()
        for layer in layers:
            check(*layer)
        return time.thread_time() - start

    row = {"new": per_call_us(first_time, repeats, device),
           "layer": min(each_layer() for _ in range(repeats)) / LAYERS * 1e6,
           "same": per_call_us(lambda: check(*values), repeats, device),
           "values": per_call_us(lambda: check(*values, check_values=True), repeats, device)}
    with replaced(LAUNCHERS[operation], "launch", lambda *a, **k: None):
        row["op"] = per_call_us(lambda: op(*values), repeats, device)
        row["wrapper"] = per_call_us(lambda: wrapper(*values), repeats, device)
        with replaced(validation.CHECKERS, operation, lambda *a, **k: None, entry=True):
            row["bare"] = per_call_us(lambda: op(*values), repeats, device)
    return row


# ---------------------------------------------------------------- --launch: real calls at T=1, H=128

LAUNCHED = "concat_and_cache_mla_rope_fused"
_LIBRARY = torch.library.Library("mla_fuse_bench", "DEF")  # the empty op of the fused op's schema
_LIBRARY.define("empty" + str(getattr(torch.ops.mla_fuse, LAUNCHED).default._schema).partition(LAUNCHED)[2])
for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("empty", lambda *args: None, _key)


def host_us(call, device: str, repeats: int, number: int) -> tuple[float, float]:
    """(CPU time, wall time) per call in microseconds, each the least over ``repeats`` runs of
    ``number`` calls; a run's wall time ends with a device sync."""
    call()  # warm up: compiles the kernel on the first launch
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    synchronize()
    cpu = wall = float("inf")
    for _ in range(repeats):
        cpu_start, wall_start = time.thread_time(), time.perf_counter()
        for _ in range(number):
            call()
        synchronize()
        cpu = min(cpu, time.thread_time() - cpu_start)
        wall = min(wall, time.perf_counter() - wall_start)
    return cpu / number * 1e6, wall / number * 1e6


class _NeverKept(dict):
    """A ``Launcher.compiled`` table that keeps nothing: every launch is Triton's ``kernel[grid](...)``
    (and no plan keeps a launch, ``launcher.Plan``: it keeps only what the table holds)."""

    def __setitem__(self, key, value):
        pass


def launched_rows(device: str, repeats: int) -> dict[str, tuple[float, float]]:
    values = list(mla_args(1, device, heads=128).values())
    tiny = torch.zeros(1, device=device)
    trivial = {"empty op, same schema (dispatch only)": lambda: torch.ops.mla_fuse_bench.empty.default(*values),
               "aten.add_ on 1 element": lambda: torch.ops.aten.add_.Scalar(tiny, 1.0)}
    op = getattr(torch.ops.mla_fuse, LAUNCHED).default
    ours = {f"torch.ops.mla_fuse.{LAUNCHED}": lambda: op(*values),
            f"mla_fuse.ops.{LAUNCHED}": lambda: getattr(ops, LAUNCHED)(*values)}
    runs, calls = (repeats, 2000) if device == "cuda" else (min(repeats, 3), 3)  # interpreted: ms a launch
    rows = {**{name: host_us(call, device, repeats, 2000) for name, call in trivial.items()},
            **{name: host_us(call, device, runs, calls) for name, call in ours.items()}}
    planned = config.planned

    def never_kept(slot, plan, *args):  # the plan kept in the slot, but not its launch
        found = planned(slot, plan, *args)
        if found:
            found.kept, found.again = False, None
        return found

    from triton import knobs

    hook = lambda metadata: None  # noqa: E731  (a profiler's launch hook: kept launches take Triton's runner)
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        rows[f"torch.ops.mla_fuse.{LAUNCHED}, a launch hook (Triton's runner)"] = host_us(
            lambda: op(*values), device, runs, calls)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    with replaced(config, "planned", never_kept):
        rows[f"torch.ops.mla_fuse.{LAUNCHED}, through the table, no kept launch"] = host_us(
            lambda: op(*values), device, runs, calls)
    with replaced(mla_rope_cache.launcher, "compiled", _NeverKept()):
        layouts.forget_layouts()  # the plans the rows above kept their launches in
        rows[f"torch.ops.mla_fuse.{LAUNCHED}, every launch Triton's run"] = host_us(lambda: op(*values), device,
                                                                                  runs, calls)
    return rows


def launch_profile(device: str, calls: int = 2000, lines: int = 14) -> str:
    """The functions ``calls`` real ``torch.ops`` calls spend their host time in, by own time."""
    values = list(mla_args(1, device, heads=128).values())
    op = getattr(torch.ops.mla_fuse, LAUNCHED).default
    op(*values)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        op(*values)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--launch", action="store_true",
                        help="also time real calls of the fused MLA op at T=1, H=128, launches included")
    options = parser.parse_args()
    columns = ["new", "layer", "same", "bare", "op", "wrapper", "values"]
    print(f"device {options.device}; microseconds of host CPU time per call (least of {options.repeats} runs); "
          "launches stubbed")
    print(f"{'operation':34} {'T':>5} " + " ".join(f"{c:>8}" for c in columns) + "  same/op  new/(bare+new)")
    for operation in LAUNCHERS:
        for tokens in (1, 64, 4096):
            row = measure(operation, tokens, options.device, options.repeats)
            cells = " ".join(f"{row[c]:8.1f}" for c in columns)
            first_share = row["new"] / (row["bare"] + row["new"])
            print(f"{operation:34} {tokens:5d} {cells}  {row['same'] / row['op']:7.0%}  {first_share:14.0%}")
    if options.launch:
        name = torch.cuda.get_device_name() if options.device == "cuda" else "CPU, Triton's interpreter"
        print(f"\nreal calls, T=1, H=128, fp8 cache, on {name}: host microseconds per call")
        print(f"{'call':84} {'cpu':>8} {'wall':>8}")
        rows = launched_rows(options.device, options.repeats)
        for call, (cpu, wall) in rows.items():
            print(f"{call:84} {cpu:8.1f} {wall:8.1f}")
        for call, (cpu, wall) in rows.items():  # the lines ci/gpu.sh's summary shows
            print(f"summary: {call}: {cpu:.1f} us host CPU, {wall:.1f} us wall per call (T=1, H=128, {name})")
        if options.device == "cuda":
            print("\nwhere a torch.ops call's host time goes (cProfile, 2000 calls, by own time):")
            print(launch_profile(options.device))


if __name__ == "__main__":
    main()
