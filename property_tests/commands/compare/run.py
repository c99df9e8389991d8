"""The run of ``mla-fuse compare`` (``cli.py``): every case on every implementation.

A case outside an implementation's declared limits, or of an operation it does not provide, is
``outside declared limits`` and does not run there. Every other case runs in the implementation's
``executor.Executor`` child, checked against the reference like ``*_matches_reference``: ``pass``,
``fail`` (a wrong result, or an exception the kernel raised), ``crash`` or ``hang``. Two passes
of one case are measured against each other (``distances.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import pathlib
import sys
import time

from hypothesis.errors import UnsatisfiedAssumption

from mla_fuse_conformance.commands.compare import cases as compare_cases

from mla_fuse_conformance.commands.compare import report

from mla_fuse_conformance.commands.report import html
from mla_fuse_conformance.commands.compare.distances import Distance
from mla_fuse_conformance.running.executor import ChildNotProvided, Crashed, Executor, Hung, RaisedInChild

OUTSIDE = "outside declared limits"


def run_compare(impl_specs: list[str], operations: list[str], cases: int, profile: str,
                report_dir: pathlib.Path, seed: int) -> int:
    # after the CLI parsed its arguments, as verify (docs/STARTUP.md): these load torch and Triton
    from mla_fuse_conformance.contract.implementation import ImplementationError, load_implementation
    from mla_fuse_conformance.running.devices import select_device, triton_kernels_for_the_run

    triton_kernels_for_the_run()  # before an adapter is imported, as verify does
    try:
        impls = [load_implementation(spec) for spec in impl_specs]
    except ImplementationError as error:
        print(f"mla-fuse compare: --impl: {error}", file=sys.stderr)
        return 2
    if len({impl.spec for impl in impls}) < len(impls):
        print(f"mla-fuse compare: --impl: two of {', '.join(impl_specs)} are the same implementation", file=sys.stderr)
        return 2
    started, device = time.monotonic(), str(select_device())
    comparison = report.Comparison(impls, cases, profile, seed)
    with contextlib.ExitStack() as stack:
        executors = {impl.spec: stack.enter_context(Executor(impl.spec, device, impl.required)) for impl in impls}
        for operation in operations:
            print(f"mla-fuse compare: {operation} ...", flush=True)
            compare_operation(comparison, impls, executors, operation)
    comparison.seconds = round(time.monotonic() - started, 1)
    print("\n".join(comparison.lines()))
    path = comparison.write(report_dir)
    page = html.write(report_dir)  # the side-by-side table, beside verify's report if the directory has one
    print(f"\nwrote {path}, {page}")
    return 0


def compare_operation(comparison, impls, executors: dict, operation: str) -> None:
    """Every case of ``operation`` on every implementation, folded into ``comparison``."""
    prop = compare_cases.reference_property(operation)
    for case in compare_cases.draw_cases(operation, comparison.cases, comparison.seed, comparison.profile):
        row = comparison.row(operation, compare_cases.cell_of(case, prop.rotates))
        passed = {}
        for impl in impls:
            outcome, outputs = run_case(impl, executors[impl.spec], prop, operation, case)
            row.count(impl.spec, outcome, outputs)
            if outcome == "pass":
                passed[impl.spec] = outputs
        for a, b in itertools.combinations(passed, 2):
            row.differences.setdefault((a, b), Distance()).add(passed[a], passed[b])


def run_case(impl, executor, prop, operation: str, case) -> tuple[str, object]:
    """``(outcome, what came with it)``: the outputs of a pass, the message of a failure."""
    if not impl.provides(operation) or not prop.allows(impl, case):
        return OUTSIDE, None
    try:
        return "pass", executor.outputs(operation, case)
    except (UnsatisfiedAssumption, ChildNotProvided):
        return OUTSIDE, None
    except Hung as error:
        return "hang", str(error)
    except Crashed as error:
        return "crash", str(error)
    except RaisedInChild as error:
        return "fail", f"raised {error.original_type}: {error}"
    except AssertionError as error:
        return "fail", str(error)
