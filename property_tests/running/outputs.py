"""One operation on one case, checked against the reference, with the memory it left behind.

``mla-fuse compare`` runs a case on several implementations, each in its own ``executor.Executor``
child, and measures in the parent how far two passing implementations are apart. ``capture`` is
what a child runs for it: the ``against_reference`` check of ``running/checks.py`` (build the
case, expect, call, compare under CONTRACT §5; a failure raises as there), then the memory image
after the call and where §5 compares with a tolerance, as plain CPU tensors:

* ``buffers``: name -> the buffer's flat elements after the operation;
* ``rotated``: ``(buffer, flat index, dtype name)`` of each rotated-value region;
* ``fp8``: ``(buffer, flat index, fp8 format)`` of each region of fp8 codes;
* ``caches``: the names of the buffers that hold a cache.
"""

from __future__ import annotations

import torch

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.judging import comparisons, oracle
from mla_fuse_conformance.running import checks

CACHE_ARGUMENTS = ("kv_cache", "key_cache", "value_cache")


def capture(impl, device, operation: str, case) -> dict:
    """Run ``operation`` of ``impl`` on ``case``; raise AssertionError where it differs from the
    reference, else return the memory after it (module docstring)."""
    built = tensors.build(case, device)
    expectation = oracle.expect(operation, built, impl)
    checks.call(impl, operation, built.args, getattr(case, "check_values", False))
    after = {name: buffer.flat.cpu() for name, buffer in built.buffers.items()}
    comparisons.raise_failures(comparisons.compare(built.buffers, after, expectation))
    return {"buffers": {name: (dtype_name(flat.dtype), flat.contiguous().view(torch.uint8).numpy().tobytes())
                        for name, flat in after.items()},
            "rotated": [(r.buffer, r.index.cpu().numpy(), dtype_name(r.dtype)) for r in expectation.rope],
            "fp8": [(r.buffer, r.index.cpu().numpy(), r.fmt) for r in expectation.fp8],
            "caches": sorted({built.view_buffer[arg] for arg in CACHE_ARGUMENTS if arg in built.view_buffer})}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def unpack(outputs: dict) -> dict[str, torch.Tensor]:
    """``outputs["buffers"]`` as flat CPU tensors of their own dtypes."""
    return {name: (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8))
            .view(getattr(torch, dtype)) for name, (dtype, data) in outputs["buffers"].items()}
