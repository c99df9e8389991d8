"""The check of a declared limit (a claim the run checks, not a place to put a defect): a few examples just
outside one declared limit (that axis pinned to a value the implementation says it does not support,
everything else inside). Outside its limits an implementation either refuses (an exception before
anything is written: every byte of every buffer unchanged, ``running.checks.Refused``) or it does not.
Each limit's outcome:

* ``unguarded: wrong result | stray write | crash | hang``: a case outside the limit ran and did harm
  (the first such case kept as a failure file, with its replay): a finding, which fails the verdict
  (docs/REPORT.md, "limits"); ``stray write``: the call wrote, then raised. Unless the adapter states
  that its callers never reach the limit (``guarded_by_caller``: which caller, where): then the check
  keeps that guard (``guarded_by``), is listed with it, and the verdict does not fail on it;
* ``refused``: every case that reached it raised before writing (the first exception's type and line);
* ``handled``: such cases pass (the limit could be widened), counted only from cases that wrote an entry
  or rotated a row, with more than one key head for per-head scales (``reaches``); a case that passed
  without reaching it is counted apart and another drawn in its place;
* ``not reached``: no case with that value could be drawn, or none of those drawn did that work.

A case inside a failing cell the run's map derived for that operation (``cells``: its condition holds,
``known_cells.KnownCell.holds``) is left out unrun, as the map leaves out a cell's cases once found: its
failure would be that cell's defect, not the limit's (SGLang's short slot mapping crashed a case with per-head
scales, which read as the per-head limit unguarded). Each outcome counts the cases left out so.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from hypothesis import reject

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.cases.features import features
from mla_fuse_conformance.commands.conformance_map.diagnosis import FAILURES, _base
from mla_fuse_conformance.commands.conformance_map.known_cells import Sorter
from mla_fuse_conformance.commands.conformance_map.property_map import search
from mla_fuse_conformance.declarations.operations import CACHING_OPERATIONS
from mla_fuse_conformance.running import recording
from mla_fuse_conformance.running.checks import Refused
from mla_fuse_conformance.settings import profiles


@dataclasses.dataclass
class LimitCheck:
    operation: str
    axis: str
    value: str
    outcome: str  # "unguarded: <how>" / "refused" / "handled" / "not reached" (module docstring)
    detail: str
    examples: int
    file: str | None = None  # an unguarded limit's failing case, saved for replay
    guarded_by: str | None = None  # the adapter's ``guarded_by_caller`` for this limit: the caller's guard

    @property
    def unguarded(self) -> bool:
        return self.outcome.startswith(UNGUARDED)

    @property
    def finding(self) -> bool:
        """Unguarded and no caller guards it: fails the verdict."""
        return self.unguarded and not self.guarded_by


UNGUARDED = "unguarded"


def refusal(error: BaseException) -> str | None:
    """The exception a refusal raised (``running.checks.Refused``, in this process or a child's), or None."""
    if isinstance(error, Refused) or getattr(error, "original_type", None) == Refused.__name__:
        return str(error)
    return None


def harm(error: BaseException) -> str:
    """How a case outside a limit did harm: ``wrong result``, ``stray write`` (it wrote, then raised),
    ``crash`` or ``hang``."""
    kind = recording.failure_kind(error)
    if kind.startswith("hung"):
        return "hang"
    if kind.startswith("crashed"):
        return "crash"
    lines = str(error).strip().splitlines()
    return "stray write" if lines and " wrote, then raised " in lines[0] else "wrong result"


def reaches(case, operation: str, axis: str = "") -> bool:
    """Whether ``case`` runs ``operation``'s work at all: a row to rotate or copy (``tokens > 0``) and,
    for an operation that writes a cache, an entry written (a slot >= 0). A limit on the cache's
    dtype or storage, say, is met only by a case that stores something. Per-head scales differ from one
    scale only with more than one key head (SGLang's kernel reads the first: cases of one head passed, and
    the limit read as handled)."""
    case = _base(case)
    if case.tokens <= 0 or (axis == "per-head scales" and case.kv_heads < 2):
        return False
    if operation not in CACHING_OPERATIONS:
        return True
    slots = tensors.build(case, "cpu").args["slot_mapping"]
    return bool((slots >= 0).any())


def check_limit(prop, impl, run_example: Callable, operation: str, axis: str, value: str,
                max_examples: int = 5, device: str = "cpu", cells: Sequence[dict] = ()) -> LimitCheck:
    """Run ``prop`` just outside one declared limit of ``operation`` (``axis`` pinned to ``value``): the
    module docstring's outcomes. A refused case is noted and the search goes on (a kernel may refuse some
    cases and corrupt others); the first case that does harm ends it. ``cells``: the failing cells the run's
    map derived (report.json entries with ``found_by``); a case inside one of ``operation``'s is left out."""
    strategy = prop.strategy_for(impl, capabilities=impl.caps(operation).only(axis, value)).filter(
        lambda case: features(_base(case), prop.rotates).get(axis) == value)  # the axis applies (a scale: fp8)
    guarded_by = impl.guarded_by_caller.get(operation, {}).get(f"{axis} {value}")
    sorter = Sorter(run_example, prop.rotates, [cell for cell in cells if operation in cell.get("operations", ())])
    refused, inside, unreached = [], [], []

    def run_counted(case):
        found = sorter.inside(case) if sorter.known else []
        if found:
            inside.append(found[0].entry["id"])
            reject()
        try:
            run_example(case)
        except FAILURES as error:
            refused_with = refusal(error)
            if refused_with is None:
                raise
            refused.append(refused_with)
            return
        if not reaches(case, operation, axis):  # passed without doing the work: another case is drawn
            unreached.append(case)
            reject()

    case, error, passed = search(prop, strategy, run_counted, [], max_examples, shrink=False)
    examples = len(passed) + len(refused) + len(unreached) + (case is not None)
    left_out = (f"; {len(inside)} case{'s' * (len(inside) > 1)} inside the map's failing cells left out "
                f"({', '.join(sorted(set(inside)))})" if inside else "")
    if case is not None:
        how = harm(error)
        failure = dict(recording.failure_record(prop, impl, device, case, error),
                       limit=f"{operation}: {axis} {value}")
        path = recording.save_failure(failure, f"limit:{prop.name}", profiles.full_name("ci"))
        message = str(error).strip().splitlines()
        return LimitCheck(operation, axis, value, f"{UNGUARDED}: {how}",
                          f"{recording.failure_kind(error)}" + (f": {message[0][:200]}" if message else "") + left_out,
                          examples, str(path), guarded_by)
    if refused:
        return LimitCheck(operation, axis, value, "refused", refused[0] + left_out, examples, guarded_by=guarded_by)
    if not passed and unreached:
        return LimitCheck(operation, axis, value, "not reached", f"{len(unreached)} examples passed, none of them "
                          "wrote an entry or rotated a row" + (" with more than one key head" if axis ==
                                                                "per-head scales" else "") + left_out, 0)
    if not passed:
        drawn = ("every case drawn was inside a failing cell of the map" if inside
                 else "no case with this value could be drawn")
        return LimitCheck(operation, axis, value, "not reached", drawn + left_out, 0)
    return LimitCheck(operation, axis, value, "handled", f"{len(passed)} examples that reached it passed" + left_out,
                      len(passed))
