"""The property modules under ``mla_fuse_conformance.properties``, by role (names without the package).

``tests/test_layering.py`` checks that every ``properties/test_*.py`` is listed here exactly once,
so a new property module must be placed: the executor preloads and ``mla-fuse verify`` imports the
kernel property modules (``running.harness.all_properties`` finds their ``@pytest.mark.mla_fuse``
tests); the fuzzer
runs the kernel modules against any implementation and the compile-pass modules only for ``triton``.
"""

from __future__ import annotations

import pathlib

PROPERTIES_PACKAGE = "mla_fuse_conformance.properties"
# Plain @given tests marked @pytest.mark.mla_fuse(operations), run against --mla-fuse-impl.
KERNEL_PROPERTY_MODULES = ("test_rotary_embedding", "test_mla", "test_flash", "test_real_sizes", "test_deployments",
                           "test_interactions")
# Kernel property modules whose tests run fixed explicit examples only (real-model sizes, one
# dimension at a time; named deployments; the covering array of interactions): nothing for a fuzzer
# to search, and no T = 0 / T = 1 edge cases.
EXPLICIT_ONLY_MODULES = ("test_real_sizes", "test_deployments", "test_interactions")
# Plain @given tests of the torch.compile passes (through mla_fuse.ops, not --mla-fuse-impl).
COMPILE_PASS_MODULES = ("test_compile_passes",)
# Fixed-case tests of --mla-fuse-impl (no search): addresses past 2^31 elements.
FIXED_CASE_MODULES = ("test_large_addresses",)


# the directory of the property modules (pytest's rootdir for the fuzzer's workers)
SUITE_DIR = pathlib.Path(__file__).resolve().parent.parent / "properties"
# the one implementation the compile passes insert (mla_fuse.ops): the compile-pass modules run only for it
PASSES_IMPLEMENTATION = "triton"


def qualified(module: str) -> str:
    """``test_mla`` -> ``mla_fuse_conformance.properties.test_mla``."""
    return f"{PROPERTIES_PACKAGE}.{module}"
