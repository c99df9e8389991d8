"""The check that declared limits are real: a few examples just outside one declared limit (that
axis pinned to a value the implementation says it does not support, everything else inside). A
failure confirms the limit; passes are noted ("declared unsupported, but handled") only from cases
that reached the limited path (``reaches``), else "not reached"."""

from __future__ import annotations

import dataclasses
from typing import Callable

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.commands.conformance_map.diagnosis import _base
from mla_fuse_conformance.commands.conformance_map.property_map import search
from mla_fuse_conformance.declarations.operations import CACHING_OPERATIONS
from mla_fuse_conformance.running import recording


@dataclasses.dataclass
class LimitCheck:
    operation: str
    axis: str
    value: str
    outcome: str  # "confirmed" (fails outside the limit) / "handled" (passes) / "not reached"
    detail: str
    examples: int


def reaches(case, operation: str) -> bool:
    """Whether ``case`` runs ``operation``'s work at all: a row to rotate or copy (``tokens > 0``) and,
    for an operation that writes a cache, an entry written (a slot >= 0). A limit on the cache's
    dtype or storage, say, is met only by a case that stores something."""
    case = _base(case)
    if case.tokens <= 0:
        return False
    if operation not in CACHING_OPERATIONS:
        return True
    slots = tensors.build(case, "cpu").args["slot_mapping"]
    return bool((slots >= 0).any())


def check_limit(prop, impl, run_example: Callable, operation: str, axis: str, value: str,
                max_examples: int = 5) -> LimitCheck:
    """Run ``prop`` just outside one declared limit of ``operation`` (``axis`` pinned to ``value``).

    "handled" only from passing cases that reached the limited path (``reaches``): a case that
    writes no entry passes whatever the kernel does with an fp8 store it never makes."""
    strategy = prop.strategy_for(impl, capabilities=impl.caps(operation).only(axis, value))
    reached = []

    def run_counted(case):
        run_example(case)
        reached.append(reaches(case, operation))

    case, error, passed = search(prop, strategy, run_counted, [], max_examples, shrink=False)
    if case is not None:
        message = str(error).strip().splitlines()
        return LimitCheck(operation, axis, value, "confirmed", f"{recording.failure_kind(error)}"
                          + (f": {message[-1][:200]}" if message else ""), len(passed) + 1)
    if not passed:
        return LimitCheck(operation, axis, value, "not reached", "no case with this value could be drawn", 0)
    if not any(reached):
        return LimitCheck(operation, axis, value, "not reached",
                          f"{len(passed)} examples passed, none of them wrote an entry or rotated a row", 0)
    return LimitCheck(operation, axis, value, "handled", f"{sum(reached)} examples that reached it passed",
                      sum(reached))
