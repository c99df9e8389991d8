"""The three ways a property checks an implementation (each is a method of ``harness.PropertyRun``):

* ``against_reference``: run one operation and compare the whole memory image with
  ``oracle.expect`` under CONTRACT §5.
* ``fused_equals_unfused``: the fused operation and the same implementation's
  ``rotary_embedding`` + cache write leave bitwise equal caches.
* ``rejects_bad_input``: a corrupted call raises ValueError/TypeError naming the
  argument, and no byte of any buffer changed.

Each takes the ``PropertyRun`` (implementation, device, the session's recorder) and the case.
"""

from __future__ import annotations

import re

import torch
from mla_fuse.validation import checking_values

from mla_fuse_conformance.cases import corruptions
from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.cases.types import BadInputCase
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS
from mla_fuse_conformance.judging import comparisons, oracle
from mla_fuse_conformance.running.events import event, target

# The suite builds one buffer per name; the fused MLA op calls its scale buffer kv_cache_scale.
BUFFER_OF_ARGUMENT = {"kv_cache_scale": "scale"}


class ImplementationAssertion(Exception):
    """An ``assert`` of the implementation itself failed (a wrapper's ``assert block_size power of 2``): what
    it raised, ``raised AssertionError``, not a wrong result (the suite's own checks raise AssertionError)."""

    original_type = "AssertionError"


def call(impl, operation: str, args: dict, check_values: bool = False) -> None:
    """``operation`` of ``impl`` on the built arguments, with the value checks on when ``check_values``
    (``mla_fuse.validation.checking_values``: our operations read it; others have their own switches)."""
    with checking_values(True if check_values else None):
        try:
            impl.op(operation)(*(args[BUFFER_OF_ARGUMENT.get(name, name)] for name in OPERATION_ARGUMENTS[operation]))
        except AssertionError as error:
            raise ImplementationAssertion(str(error)) from error


def _count_padding(run, case) -> None:
    stats = run.recorder.stats
    slots = getattr(case, "slots", None)
    if stats is not None and slots is not None and (slots.padding != "none" or slots.length < case.tokens):
        stats.padded_slot_cases += 1


class Refused(Exception):
    """Outside a declared limit (a limit check: ``PropertyRun.within_limits`` false), the implementation
    raised before writing anything: every byte of every buffer unchanged. The message is the exception's
    type and first line."""


def _refusal(built, operation: str, error: Exception, before: dict) -> Refused:
    """``Refused`` when ``error`` left every buffer as it was; an AssertionError naming what was written else."""
    raised = getattr(error, "original_type", type(error).__name__)
    comparisons.assert_buffers_equal(built.buffers, {n: b.flat for n, b in built.buffers.items()}, before,
                                     f"{operation} wrote, then raised {raised} outside a declared limit")
    lines = str(error).strip().splitlines()
    return Refused(f"{raised}: {lines[0][:200]}" if lines else raised)


def against_reference(run, case, operation: str) -> comparisons.Outcome:
    """Run ``operation`` once; the whole memory image must match the reference under §5. Outside the
    declared limits (a limit check), an exception that changed no byte is a refusal (``Refused``)."""
    impl, device = run.impl, run.device
    built = tensors.build(case, device)
    expectation = oracle.expect(operation, built, impl)
    saturated = oracle.saturated_fraction(expectation)
    target(saturated, "fraction of fp8 codes saturated")
    if saturated:
        event("fp8 saturation")
        run.recorder.stats.saturation_cases += 1
    _count_padding(run, case)
    before = None if run.within_limits else built.snapshot()
    try:
        call(impl, operation, built.args, getattr(case, "check_values", False))
    except Exception as error:  # noqa: BLE001 - outside a declared limit: refused, or it wrote first
        if before is None:
            raise
        raise _refusal(built, operation, error, before) from error
    outcome = comparisons.compare(built.buffers, {n: b.flat for n, b in built.buffers.items()}, expectation)
    run.recorder.observe(outcome)  # failing examples count too
    target(outcome.worst_rope_bound_fraction, "worst rotated-value error / bound")
    return comparisons.raise_failures(outcome)


UNFUSED_CHAINS = {  # fused op -> (cache op, query, key, caches)
    "concat_and_cache_mla_rope_fused": ("concat_and_cache_mla", "q_pe", "k_pe", ("kv_cache",)),
    "rope_and_reshape_and_cache_flash": ("reshape_and_cache_flash", "query", "key", ("key_cache", "value_cache")),
}


def fused_equals_unfused(run, case, fused: str) -> None:
    """Fused op vs the same implementation's rotary_embedding + cache write: caches bitwise equal."""
    impl, device = run.impl, run.device
    cache_op, query, key, cache_args = UNFUSED_CHAINS[fused]
    fused_run, chain_run = tensors.build(case, device), tensors.build(case, device)
    _count_padding(run, case)
    call(impl, fused, fused_run.args, case.check_values)
    args = chain_run.args
    head_size = args[key].size(-1)
    call(impl, "rotary_embedding", dict(args, query=args[query], key=args[key], head_size=head_size))
    call(impl, cache_op, args, case.check_values)
    caches = {name: fused_run.buffers[name].flat for name in {fused_run.view_buffer[arg] for arg in cache_args}}
    comparisons.assert_buffers_equal(
        chain_run.buffers, caches, {name: chain_run.buffers[name].flat for name in caches},
        f"{fused} and the same implementation's rotary_embedding + {cache_op} wrote different caches "
        "(got: fused; expected: unfused chain)")


def rejects_bad_input(run, case: BadInputCase) -> None:
    """The corrupted call raises ValueError/TypeError naming the argument and changes nothing.

    Value checks are on by default here; a rule that needs no sync must also hold with them
    off. When the implementation's operation carries ``custom_op`` (the entry point compiled
    graphs call, skipping the wrapper: ``torch.ops.mla_fuse.*`` for ours), it is called too.
    """
    impl, device = run.impl, run.device
    built = tensors.build(case.base, device)
    corrupted = corruptions.corrupt(case.operation, case.corruption, built)
    before = built.snapshot()
    extra = {name: value.clone() for name, value in corrupted.args.items()
             if isinstance(value, torch.Tensor) and value is not built.args.get(name) and value.device.type != "meta"}
    wrapper = impl.op(case.operation)
    entry_points = {"": wrapper}
    if corrupted.direct and getattr(wrapper, "custom_op", None) is not None:
        entry_points[f" through {wrapper.custom_op} (the entry point compiled graphs call)"] = wrapper.custom_op
    arguments = [corrupted.args[BUFFER_OF_ARGUMENT.get(name, name)] for name in OPERATION_ARGUMENTS[case.operation]]
    runs = [(entry, function, check_values) for entry, function in entry_points.items()
            for check_values in ((True,) if corrupted.check_values else (True, False))]
    for entry, function, check_values in runs:
        how = f"{entry} with value checks {'on' if check_values else 'off'}"
        try:
            with checking_values(True if check_values else False):
                function(*arguments)
        except (ValueError, TypeError) as error:
            message = str(error)
            named = [name for name in corrupted.names if re.search(rf"\b{re.escape(name)}\b", message)]
            assert named, (f"{case.operation} rejected '{case.corruption}'{how} but the message names none of "
                           f"{corrupted.names}: {message!r}")
        except Exception as error:  # noqa: BLE001 - any other failure is the finding
            raise AssertionError(f"{case.operation} with '{case.corruption}'{how} raised {type(error).__name__} "
                                 f"instead of ValueError/TypeError naming {corrupted.names}: {error}") from error
        else:
            raise AssertionError(f"{case.operation} accepted bad input '{case.corruption}'{how} "
                                 f"(expected ValueError/TypeError naming one of {corrupted.names})")
        comparisons.assert_buffers_equal(built.buffers, {n: b.flat for n, b in built.buffers.items()}, before,
                                         f"{case.operation} wrote before rejecting '{case.corruption}'{how}")
        for name, clone in extra.items():
            assert torch.equal(comparisons.memory.bits(corrupted.args[name]).cpu(),
                               comparisons.memory.bits(clone).cpu()), \
                f"{case.operation} wrote to argument '{name}' before rejecting '{case.corruption}'{how}"
