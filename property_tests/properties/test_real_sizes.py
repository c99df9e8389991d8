"""Every operation at the sizes real models run, one dimension at a time (``cases/boundaries.py``).

Each test runs, as explicit examples, a case just past every power of two from 16 up to the
largest size a model preset or serving engine uses in each dimension (tokens also past CUDA's
65,535-row grid limit, table rows and positions past 2^15 and 2^16), every other size minimal:
a tile without a loop, a capped grid or a narrow index type fails here on the CPU too. Under
``mla_fuse.gpu`` and ``mla_fuse.nightly`` the other properties also draw the presets' sizes as
ordinary cases (``cases.sizes.LARGE``).
"""

import pytest
from hypothesis import Phase, given, settings, strategies as st

from mla_fuse_conformance.cases.boundaries import crossings
from mla_fuse_conformance.running.harness import examples

ROTARY = "rotary_embedding"
MLA_WRITE, MLA_FUSED = "concat_and_cache_mla", "concat_and_cache_mla_rope_fused"
FLASH_WRITE, FLASH_FUSED = "reshape_and_cache_flash", "rope_and_reshape_and_cache_flash"


def crossing(operation):
    """Every crossing of ``operation`` as explicit examples, nothing else under pytest (the strategy,
    for a fuzzer or the mutation self-test, draws from the same cases)."""
    cases = crossings(operation)
    return lambda test: examples(cases)(settings(phases=(Phase.explicit,))(given(case=st.sampled_from(cases))(test)))


@pytest.mark.mla_fuse(ROTARY)
@crossing(ROTARY)
def test_rotary_embedding_at_real_sizes(mla_fuse, case):
    mla_fuse.against_reference(case, ROTARY)


@pytest.mark.mla_fuse(MLA_WRITE)
@crossing(MLA_WRITE)
def test_mla_cache_write_at_real_sizes(mla_fuse, case):
    mla_fuse.against_reference(case, MLA_WRITE)


@pytest.mark.mla_fuse(MLA_FUSED)
@crossing(MLA_FUSED)
def test_fused_mla_at_real_sizes(mla_fuse, case):
    mla_fuse.against_reference(case, MLA_FUSED)


@pytest.mark.mla_fuse(FLASH_WRITE)
@crossing(FLASH_WRITE)
def test_flash_cache_write_at_real_sizes(mla_fuse, case):
    mla_fuse.against_reference(case, FLASH_WRITE)


@pytest.mark.mla_fuse(FLASH_FUSED)
@crossing(FLASH_FUSED)
def test_fused_flash_at_real_sizes(mla_fuse, case):
    mla_fuse.against_reference(case, FLASH_FUSED)
