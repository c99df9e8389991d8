"""Mutation self-test of the property suite.

Every mutant of ``mla_fuse_conformance.mutants.kernels`` carries one bug from ``docs/BUGS.md``; the
properties of ``property_tests/`` must catch each of them within the ``ci`` profile
(derandomized, the same examples as CI), and must pass ``mutant:none``, the bug-free
base. A mutant counts as caught only when a property *asserts* (AssertionError): a
mutant that crashes is a broken mutant, not a caught one.

Each mutant runs the properties in ``ORDER`` until one fails, without shrinking; the
time and the number of examples to the first failure go to
``.mla_fuse_reports/mutants.jsonl`` (or ``$MLA_FUSE_REPORT_DIR``), and the property
suite's conftest prints them as a table at the end of the session.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import Verbosity, example, given, settings

import mla_fuse_conformance.properties.test_flash  # noqa: F401  (registers the properties)
import mla_fuse_conformance.properties.test_mla  # noqa: F401
import mla_fuse_conformance.properties.test_rotary_embedding  # noqa: F401
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.declarations.operations import FUSED_OPERATIONS, ROTATING_OPERATIONS
from mla_fuse_conformance.mutants.bug_classes import DECLARATIONS
from mla_fuse_conformance.mutants.kernels import APPROXIMATED, BUG_CLASSES, HONEST, MUTANTS
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running.devices import select_device
from mla_fuse_conformance.running.harness import NotProvided, all_properties

# cheapest and broadest first: the fused properties see rope and cache at once
ORDER = [
    "test_mla:test_fused_mla_matches_reference",
    "test_flash:test_fused_flash_matches_reference",
    "test_rotary_embedding:test_rotary_embedding_matches_reference",
    "test_mla:test_mla_cache_write_matches_reference",
    "test_flash:test_flash_cache_write_matches_reference",
    "test_mla:test_fused_mla_equals_unfused_chain",
    "test_flash:test_fused_flash_equals_unfused_chain",
    "test_rotary_embedding:test_rotary_embedding_rejects_bad_input",
    "test_mla:test_mla_cache_write_rejects_bad_input",
    "test_mla:test_fused_mla_rejects_bad_input",
    "test_flash:test_flash_cache_write_rejects_bad_input",
    "test_flash:test_fused_flash_rejects_bad_input",
    # real-model sizes, one dimension at a time: the tile, grid and narrow-type mutants
    "test_real_sizes:test_fused_mla_at_real_sizes",
    "test_real_sizes:test_fused_flash_at_real_sizes",
    "test_real_sizes:test_rotary_embedding_at_real_sizes",
    "test_real_sizes:test_mla_cache_write_at_real_sizes",
    "test_real_sizes:test_flash_cache_write_at_real_sizes",
    # named deployments: conditions that meet in one engine call (layouts, sizes, fp8, batch kind)
    "test_deployments:test_reshape_and_cache_flash_in_deployment",
    "test_deployments:test_concat_and_cache_mla_rope_fused_in_deployment",
    "test_deployments:test_concat_and_cache_mla_in_deployment",
    "test_deployments:test_rotary_embedding_in_deployment",
    "test_deployments:test_rope_and_reshape_and_cache_flash_in_deployment",
    # interactions: each feature value with each size crossing (a product past a tile, fp8 past a size)
    "test_interactions:test_fused_mla_interactions",
    "test_interactions:test_fused_flash_interactions",
    "test_interactions:test_rotary_embedding_interactions",
    "test_interactions:test_mla_cache_write_interactions",
    "test_interactions:test_flash_cache_write_interactions",
]


def test_order_lists_every_property():
    assert sorted(ORDER) == sorted(all_properties())


def hunt(prop, impl, device, strategy, max_examples: int, explicit=()):
    """Run one property variant like the ci profile does, stopping at the first failure.
    Returns ``(error or None, examples run)``; NotProvided propagates."""
    examples = 0

    @settings(profiles.ci_settings(max_examples=max_examples, phases=profiles.NO_SHRINK_PHASES,
                                   report_multiple_bugs=False, verbosity=Verbosity.quiet))
    @given(case=strategy)
    def run(case):
        nonlocal examples
        examples += 1
        prop.run(impl, device, case)

    for case in explicit:  # the property's found bugs and edge cases run first, as under pytest
        run = example(case=case)(run)
    try:
        run()
    except NotProvided:
        raise
    except AssertionError as error:
        return error, examples
    return None, examples


# What each declaration of the honest variants changes: padded_rows, which rows the fused operations
# rotate; rounding, the bound of every rotated value (both read by judging/oracle.py alone). A variant
# is the base's code with other declarations, so a property of no operation listed here judges it
# exactly as it judges mutant:none (test_the_declarations_are_read_for_their_operations_only).
DECLARED_FOR = {"padded_rows": FUSED_OPERATIONS, "rounding": ROTATING_OPERATIONS}


def variant_operations(variant: str) -> set[str] | None:
    """The operations whose properties the honest ``variant`` must pass beyond the base's (None: all)."""
    declared = DECLARATIONS.get(variant)
    return None if not declared else {op for name in declared for op in DECLARED_FOR[name]}


def run_properties(impl, device, stop_at_first: bool, operations: set[str] | None = None):
    """-> (caught: list of (property, error, examples)), examples run in all; ``operations``: only the
    properties of one of these operations (None: every property)."""
    caught, total = [], 0
    properties = all_properties()
    for name in ORDER:
        prop = properties[name]
        if operations is not None and not operations & set(prop.operations):
            continue
        for strategy in prop.strategies:
            max_examples = prop.examples_per_variant or profiles.CI_MAX_EXAMPLES
            try:
                error, examples = hunt(prop, impl, device, strategy, max_examples, prop.examples)
            except NotProvided:
                break
            total += examples
            if error is not None:
                caught.append((name, error, total))
                if stop_at_first:
                    return caught, total
                break
    return caught, total


@pytest.mark.parametrize("mutant", sorted(set(MUTANTS) - HONEST))
def test_mutant_is_caught(mutant, mutant_results):
    impl = load_implementation(f"mutant:{mutant}")
    start = time.perf_counter()
    try:
        caught, examples = run_properties(impl, select_device(), stop_at_first=True)
    except Exception as error:  # a crash is a broken mutant, not a catch
        mutant_results(dict(mutant=mutant, result="crashed", seconds=time.perf_counter() - start,
                                            examples=0, property=None, message=repr(error), time=time.time()))
        raise
    seconds = time.perf_counter() - start
    name, error, _ = caught[0] if caught else (None, None, None)
    mutant_results(dict(
        mutant=mutant, result="caught" if caught else "MISSED", seconds=seconds, examples=examples,
        property=name and name.rpartition(":")[2], bug_class=BUG_CLASSES[mutant][0],
        approximated=mutant in APPROXIMATED, message=str(error).splitlines()[:2] if error else None,
        time=time.time()))
    assert caught, f"no property caught mutant:{mutant} ({BUG_CLASSES[mutant][1]}) in {examples} examples"
    print(f"mutant:{mutant} caught by {name} after {examples} examples in {seconds:.2f}s")


# padded_rows is honoured per change by none_padded_skipped; its other value (q_only) is the same oracle path
# (judging/oracle.py reads which rows are rotated) at another value: nightly (`pytest --nightly`)
NIGHTLY_VARIANTS = {"none_padded_q_only"}


@pytest.mark.parametrize("variant", [pytest.param(name, marks=pytest.mark.nightly) if name in NIGHTLY_VARIANTS
                                     else name for name in sorted(HONEST)])
def test_bug_free_variants_pass_every_property(variant, mutant_results):
    """The base, and the base with each other declaration (padded_rows, rounding) it honours: every
    property of the operations the declaration is read for (``DECLARED_FOR``)."""
    impl = load_implementation(f"mutant:{variant}")
    start = time.perf_counter()
    caught, examples = run_properties(impl, select_device(), stop_at_first=False,
                                      operations=variant_operations(variant))
    mutant_results(dict(mutant=variant, result="passed" if not caught else "FAILED",
                                        seconds=time.perf_counter() - start, examples=examples,
                                        property=caught[0][0].rpartition(":")[2] if caught else None,
                                        time=time.time()))
    assert not caught, "\n\n".join(f"{name}: {error}" for name, error, _ in caught)


def test_the_declarations_are_read_for_their_operations_only():
    """``DECLARED_FOR`` true and needed: judging each operation's case reads a variant's declaration
    exactly for the operations listed (an implementation that records the attributes read)."""
    from mla_fuse_conformance.cases import tensors
    from mla_fuse_conformance.declarations.operations import OPERATIONS
    from mla_fuse_conformance.judging import oracle

    base = load_implementation("mutant:none")

    class Recording:
        def __init__(self):
            self.read = set()

        def __getattr__(self, name):
            self.read.add(name)
            return getattr(base, name)

    properties = all_properties()
    for op in OPERATIONS:
        prop = next(p for name, p in properties.items() if p.operations == (op,) and p.examples
                    and name.endswith("_matches_reference"))
        impl = Recording()
        oracle.expect(op, tensors.build(prop.examples[0], "cpu"), impl)
        for declaration, operations in DECLARED_FOR.items():
            assert (declaration in impl.read) == (op in operations), (op, declaration, impl.read)
