"""The device the properties run on: CUDA when there is one, else the CPU.

Under pytest-xdist on a machine with several GPUs, worker ``gwN`` uses device
``N % device_count``. ``$MLA_FUSE_DEVICE`` overrides the choice (``cpu``, ``cuda:1``).

The compile-pass kit has no choice to make: its models go where mla_fuse's own kernels run
(``kernels_device``), and ``allocated_bytes`` counts what a step allocates on that device.
"""

from __future__ import annotations

import os

import torch

DEVICE_ENV_VAR = "MLA_FUSE_DEVICE"


def select_device() -> torch.device:
    chosen = os.environ.get(DEVICE_ENV_VAR)
    if chosen:
        return torch.device(chosen)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return torch.device("cuda", index % torch.cuda.device_count())


# ------------------------------------------------------------------ the kernels' device, what a step allocates there


def kernels_device() -> torch.device:
    """The device mla_fuse's kernels run on in this process (``mla_fuse.kernels.BACKEND``): the current
    CUDA device when they run on the GPU, else the CPU (Triton's interpreter runs on CPU tensors). The
    compile-pass models, caches and steps are built here: a GPU process refuses CPU tensors by name."""
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
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    return sum(max(event.self_cpu_memory_usage, 0) for event in prof.events())
