"""The device the properties run on: CUDA when there is one, else the CPU.

Under pytest-xdist on a machine with several GPUs, worker ``gwN`` uses device
``N % device_count``. ``$MLA_FUSE_DEVICE`` overrides the choice (``cpu``, ``cuda:1``).

The compile-pass kit has no choice to make: its models go where mla_fuse's own kernels run
(``kernels_device``), and ``allocated_bytes`` counts what a step allocates on that device.

The suite's own work (building cases, the float64 reference, comparing) runs on the CPU whatever
the device: processes run side by side (xdist workers, ``mla-fuse fuzz`` workers) share torch's
CPU threads (``worker_threads``).
"""

from __future__ import annotations

import os

import torch
from torch.profiler import ProfilerActivity, profile

from mla_fuse_conformance.declarations.options import (SET_BY_MLA_FUSE_ENV_VAR, TRITON_INTERPRET_ENV_VAR,
                                                        users_triton_interpret)
from mla_fuse_conformance.running import interpreter_corrections

DEVICE_ENV_VAR = "MLA_FUSE_DEVICE"
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # a CPU thread count the user set: left as it is


def select_device() -> torch.device:
    chosen = os.environ.get(DEVICE_ENV_VAR)
    if chosen:
        return torch.device(chosen)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return torch.device("cuda", index % torch.cuda.device_count())


# ------------------------------------------------------------------ where an adapter's Triton kernels run

INTERPRET_ENV_VAR = TRITON_INTERPRET_ENV_VAR


def interpret_triton_without_a_gpu() -> str:
    """Where there is no GPU and the user set no ``TRITON_INTERPRET``, set ``TRITON_INTERPRET=1`` (before an
    adapter is imported: ``@triton.jit`` reads it when it decorates), so that a team's Triton kernels run
    under Triton's interpreter as the suite's own do, in this process and the processes it starts (pytest
    workers, the map's children, printed replays run by ``mla-fuse repro``, which calls this too). The
    user's own setting is kept. Returns where such kernels run, for the report's header."""
    own = users_triton_interpret(os.environ)
    if own is not None:
        on = own.strip().lower() in ("1", "true", "on", "yes")
        return ("Triton's interpreter" if on else "the GPU") + f" ({INTERPRET_ENV_VAR}={own}, yours)"
    if INTERPRET_ENV_VAR not in os.environ and torch.cuda.is_available():
        return "the GPU"
    os.environ[INTERPRET_ENV_VAR] = os.environ[SET_BY_MLA_FUSE_ENV_VAR] = "1"  # the mark: not the user's
    return f"Triton's interpreter ({INTERPRET_ENV_VAR}=1, set by mla-fuse: no GPU)"


def triton_kernels_for_the_run() -> str:
    """Where this run's Triton kernels run (``interpret_triton_without_a_gpu``: before an adapter is imported),
    and Triton's interpreter corrected for every kernel it runs, a team's included
    (``interpreter_corrections.correct_for_the_run``; nothing changes on a GPU). Returns the header's line."""
    where = interpret_triton_without_a_gpu()
    interpreter_corrections.correct_for_the_run()
    return where


# ------------------------------------------------------------------ CPU threads of parallel processes


def threads_per_worker(threads: int, workers: int) -> int:
    """torch's CPU threads for one of ``workers`` processes that share the ``threads`` it would take alone."""
    return max(1, threads // max(1, workers))


def worker_threads(workers: int) -> int | None:
    """torch's CPU threads for one of ``workers`` processes of the suite on this machine, or None where
    the user set a count (``OMP_NUM_THREADS``/``MKL_NUM_THREADS``) or the process runs alone.

    Every case is built, its float64 reference computed and the result compared with torch on the CPU,
    whatever the kernels' device; N processes each starting one thread per core wait on each other's
    threads (16 threads a core, as 16 workers on a 16-core runner: two ``gpu``-profile properties
    3.1-3.4x slower; docs/DESIGN.md, "CPU threads of the workers")."""
    if workers <= 1 or any(os.environ.get(name) for name in THREAD_ENV):
        return None
    return threads_per_worker(torch.get_num_threads(), workers)


# ------------------------------------------------------------------ the kernels' device, what a step allocates there


def kernels_device() -> torch.device:
    """The device mla_fuse's kernels run on in this process (``mla_fuse.kernels.BACKEND``): the current
    CUDA device when they run on the GPU, else the CPU (Triton's interpreter runs on CPU tensors). The
    compile-pass models, caches and steps are built here: a GPU process refuses CPU tensors by name."""
    # deferred: mla_fuse.kernels chooses its backend when first imported, after triton_kernels_for_the_run
    from mla_fuse.kernels import BACKEND

    return torch.device("cuda", torch.cuda.current_device()) if BACKEND == "gpu" else torch.device("cpu")


def allocated_bytes(step, device: torch.device | str | None = None) -> int:
    """Bytes allocated on ``device`` (default: ``kernels_device()``) by ``step()``: the sum of every
    allocation, freed or not (a copy of a cache counts its bytes however short-lived).

    CPU: ``torch.profiler`` with ``profile_memory=True``, every op's positive self memory usage
    (allocations made outside any op included). CUDA: the caching allocator's cumulative
    ``allocated_bytes.all.allocated`` counter around the synchronized step (the profiler's CPU
    events do not see device memory)."""
    device = torch.device(device) if device is not None else kernels_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0) - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return sum(max(event.self_cpu_memory_usage, 0) for event in prof.events())
