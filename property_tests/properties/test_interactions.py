"""Every operation where two conditions meet: each feature value with each size crossing
(``cases/interactions.py``).

Each test runs, as explicit examples, a covering array of strength 2 over the operation's
parameters: the first and last crossing of each dimension and the products a kernel may tile
(heads x rotary pairs, KV heads x head size, tokens x heads) at the presets' largest, paired with
every value of every feature axis (dtype, cache format, scale, layouts, padding, style, ...). A
size-specific code path that forgets the fp8 scale, or a tile over a product of two dimensions,
fails here on the CPU in every profile.
"""

import pytest
from hypothesis import Phase, given, settings, strategies as st

from mla_fuse_conformance.cases.interactions import interaction_cases
from mla_fuse_conformance.running.harness import examples

ROTARY = "rotary_embedding"
MLA_WRITE, MLA_FUSED = "concat_and_cache_mla", "concat_and_cache_mla_rope_fused"
FLASH_WRITE, FLASH_FUSED = "reshape_and_cache_flash", "rope_and_reshape_and_cache_flash"


def covering(operation):
    """The covering array of ``operation`` as explicit examples, nothing else under pytest (the
    strategy, for a fuzzer or the mutation self-test, draws from the same cases)."""
    cases = interaction_cases(operation)
    explicit_only = settings(phases=(Phase.explicit,))
    return lambda test: examples(cases)(explicit_only(given(case=st.sampled_from(cases))(test)))


@pytest.mark.mla_fuse(ROTARY)
@covering(ROTARY)
def test_rotary_embedding_interactions(mla_fuse, case):
    mla_fuse.against_reference(case, ROTARY)


@pytest.mark.mla_fuse(MLA_WRITE)
@covering(MLA_WRITE)
def test_mla_cache_write_interactions(mla_fuse, case):
    mla_fuse.against_reference(case, MLA_WRITE)


@pytest.mark.mla_fuse(MLA_FUSED)
@covering(MLA_FUSED)
def test_fused_mla_interactions(mla_fuse, case):
    mla_fuse.against_reference(case, MLA_FUSED)


@pytest.mark.mla_fuse(FLASH_WRITE)
@covering(FLASH_WRITE)
def test_flash_cache_write_interactions(mla_fuse, case):
    mla_fuse.against_reference(case, FLASH_WRITE)


@pytest.mark.mla_fuse(FLASH_FUSED)
@covering(FLASH_FUSED)
def test_fused_flash_interactions(mla_fuse, case):
    mla_fuse.against_reference(case, FLASH_FUSED)
