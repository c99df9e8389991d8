"""Every operation in every named deployment it runs in (``declarations/deployments.py``).

A deployment is a model at a TP degree, a cache format and scale, a block size, an engine's tensor
layouts and a batch kind, all in one call: bugs live where two of these meet (a size past a tile
with an fp8 cache and a non-unit scale; a contiguous ``kv_c`` beside a ``k_pe`` sliced from a wider
projection; a prefill chunk into a view of an engine's pool). ``cases/deployment_cases.py`` turns
each into the case the engine's call makes, at the deployment's per-rank sizes and CPU-sized token
counts; each test runs one explicit example per deployment, under pytest as
``test_<operation>_in_deployment[<deployment name>]``.

A deployment outside the implementation's declared limits (its ``capabilities``) is skipped with a
reason ``not supported (declared): <axis> <value>, ...`` (the report's per-deployment verdicts read
the node ids and these reasons), not moved inside them as random cases are; unless the implementation
``serves`` the deployment's engine layout for the operation (it stands in for that engine's call, as
FlagGems' vLLM patch does for vLLM's): then it runs whatever is declared, and a refusal fails.

A user's own deployments: an adapter attribute ``deployments = (Deployment(...), ...)``, or a
conftest.py's ``pytest_mla_fuse_deployments(config)`` hook (``hookspecs.py``) returning them
(``mla_fuse_conformance.declarations.deployments.Deployment``, whose ``preset`` may be the user's
own ``Preset``; ``problems_of`` says what is wrong with one): the plugin checks them and runs them
in these tests beside the suite's, under their own names (``pytest_generate_tests``). ``deployments.cpu_elements`` says what one example allocates.
"""

import dataclasses

import pytest
from hypothesis import given, strategies as st

from mla_fuse_conformance.cases.deployment_cases import deployment_cases

ROTARY = "rotary_embedding"
MLA_WRITE, MLA_FUSED = "concat_and_cache_mla", "concat_and_cache_mla_rope_fused"
FLASH_WRITE, FLASH_FUSED = "reshape_and_cache_flash", "rope_and_reshape_and_cache_flash"
UNSUPPORTED = "not supported (declared): "


def in_deployments(operation):
    """The test run by pytest once per deployment of ``operation`` (the plugin parametrizes ``case``,
    id the deployment's name, the implementation's own deployments included: ``mla_fuse_deployments``
    names the operation), and the same body given the suite's deployments' cases by hypothesis
    (``test.hypothesis``: what ``harness.property_of``, the mutation self-test and a fuzzer run; a
    ``sampled_from`` of a few cases is exhausted in as many examples, each deployment once)."""
    cases = deployment_cases(operation)

    def decorate(body):
        drawn = given(case=st.sampled_from(list(cases.values())))(body)

        def test(mla_fuse, case, deployment_layout):
            if deployment_layout in mla_fuse.impl.serves.get(operation, ()):
                mla_fuse = dataclasses.replace(mla_fuse, served=deployment_layout)
            else:
                skip_if_declared_outside(mla_fuse, case, operation)
            body(mla_fuse, case)

        test.__name__, test.__qualname__, test.__doc__ = body.__name__, body.__qualname__, body.__doc__
        test.__module__ = body.__module__
        test.hypothesis = drawn.hypothesis
        test.mla_fuse_deployments = operation
        return test

    return decorate


def skip_if_declared_outside(mla_fuse, case, operation):
    violations = mla_fuse.impl.caps(operation).violations(case, mla_fuse.prop.rotates)
    if violations:
        pytest.skip(UNSUPPORTED + ", ".join(f"{axis} {value}" for axis, value in violations.items()))


@pytest.mark.mla_fuse(ROTARY)
@in_deployments(ROTARY)
def test_rotary_embedding_in_deployment(mla_fuse, case):
    mla_fuse.against_reference(case, ROTARY)


@pytest.mark.mla_fuse(MLA_WRITE)
@in_deployments(MLA_WRITE)
def test_concat_and_cache_mla_in_deployment(mla_fuse, case):
    mla_fuse.against_reference(case, MLA_WRITE)


@pytest.mark.mla_fuse(MLA_FUSED)
@in_deployments(MLA_FUSED)
def test_concat_and_cache_mla_rope_fused_in_deployment(mla_fuse, case):
    mla_fuse.against_reference(case, MLA_FUSED)


@pytest.mark.mla_fuse(FLASH_WRITE)
@in_deployments(FLASH_WRITE)
def test_reshape_and_cache_flash_in_deployment(mla_fuse, case):
    mla_fuse.against_reference(case, FLASH_WRITE)


@pytest.mark.mla_fuse(FLASH_FUSED)
@in_deployments(FLASH_FUSED)
def test_rope_and_reshape_and_cache_flash_in_deployment(mla_fuse, case):
    mla_fuse.against_reference(case, FLASH_FUSED)
