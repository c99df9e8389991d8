"""The device the properties run on: CUDA when there is one, else the CPU.

Under pytest-xdist on a machine with several GPUs, worker ``gwN`` uses device
``N % device_count``. ``$MLA_FUSE_DEVICE`` overrides the choice (``cpu``, ``cuda:1``).
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
