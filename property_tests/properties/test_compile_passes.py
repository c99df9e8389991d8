"""Fuzzing the torch.compile fusion passes on the compile path as serving engines run it
(CONTRACT §6, docs/PASSES.md).

Each example (``compile_passes.cases.CompileCase``) draws a toy model (MLA, MHA or hybrid stacks of 1-3
residual blocks, every rope form and style, layers in the situations a pass must recognise),
caches laid out as engines lay them out (views of one pool, chunked or interleaved; K/V views
of one tensor; HND), a cache format (fp8 in uint8 or float8 storage), a step, and how it is
compiled: real Inductor for a share of the examples (``compile_passes.cases.INDUCTOR_SHARE``, plus the
explicit ones), the light backend (Inductor's graph passes, then eager) for the rest; a dynamic
token count in most; the fusion on, or off each way it can be. ``compile_passes.checks.check_compile_case``
then requires:

* the fusion fired exactly where it should: the match counts, one fused node per fused layer
  (in place, not ``auto_functionalized``, before that layer's attention), the unfused update
  left for every other layer, the kernels that run (counted);
* compiled with the passes == without them, bit for bit: the model output, every layer's rotated q
  and k, and every byte of every cache pool (inside the views or not), against eager and, on Inductor
  where eager differs, against Inductor at O0 (no pass: Inductor's own float32 sums are not ATen's,
  docs/PASSES.md "What the property compares"); again for a second token count with the same graph
  when the count is dynamic;
* no cache copy: no cache pool is an input of a compiled graph, and the bytes a step allocates
  do not grow with the cache (the same step on caches four times larger);
* the ops the passes leave in the graph declare what they write and have fakes that agree with
  them (``torch.library.opcheck``, on the graph's own argument shapes);
* on Inductor, a second compile served by the FX graph cache reports the same counts, says it
  came from the cache, and computes the same bits.

These properties test the passes (through ``mla_fuse.ops``, i.e. the ``triton`` implementation),
not an implementation under ``--mla-fuse-impl``. Models, caches and steps live on the kernels' device
(``running.devices.kernels_device``: CUDA in a process whose kernels run on the GPU, where Inductor
generates Triton code, else the CPU), and a step's bytes are counted with that device's statistics. An example runs as the kernel properties' do
(``harness.PropertyRun.example``; ``harness.property_named`` finds the test): a failing one leaves a failure
file in the same format (``running/recording.py``), holding the ``CompileCase`` itself, which
``mla-fuse repro FILE`` replays without hypothesis; it also prints ``case = CompileCase(...)``.

Each example is a pure function of its case (docs/PASSES.md, "Purity"): ``check_compile_case``
starts from a reset dynamo (``torch._dynamo.reset()``) and compiles under a cache key of its own,
the counts it reads are per compiled model, and the state meant to persist across examples
(the traced patterns of ``pattern_utils``, Inductor's on-disk FX graph cache) does not change an
outcome: ``tests/test_compile_purity.py`` runs the same cases in different orders and requires
the same outcome.
The pass mutation self-test (``tests/test_pass_mutants.py``) runs these properties, alone,
against deliberately broken passes.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.cases.engine_caches import CacheLayout  # noqa: F401  (names for replaying a printed case)
from mla_fuse_conformance.compile_passes import axes  # noqa: F401  (the conformance map's fields and axes of a CompileCase)
from mla_fuse_conformance.compile_passes.cases import CompileCase, FusionSettings, compile_cases
from mla_fuse_conformance.compile_passes.checks import (
    check_planted, plant_pass_mutant, planted_pass_mutant,
)
from mla_fuse_conformance.compile_passes.models import MhaGeometry, MlaGeometry, ModelSpec  # noqa: F401
from mla_fuse_conformance.contract.implementation import resolve_spec
from mla_fuse_conformance.declarations.property_modules import PASSES_IMPLEMENTATION
from mla_fuse_conformance.running.harness import examples

PLANTED = plant_pass_mutant(planted_pass_mutant())  # $MLA_FUSE_PASS_MUTANT at import, held for the process's life


# Found bugs and the situations each bug class of docs/BUGS.md needs, run first on every profile
# (light ones first: the mutation self-test stops at the first failure).
EXPLICIT = [
    # the serving-engine path: hybrid, native rope, dynamic tokens, one rope module, an interleaved pool, fp8
    CompileCase(ModelSpec(("mla", "mha", "mla"), ("plain",) * 3, rope="native", shared_rope=True,
                          mha=MhaGeometry(heads=2, kv_heads=2, head_size=8, rotary_dim=8)),
                CacheLayout("interleaved", "flashinfer"), "fp8", tokens=5, second_tokens=3, padded=(4,),
                unmapped=(2,)),
    # readers the fusion must respect: a second reader of the packed qkv, a pre-rotation k_pe
    CompileCase(ModelSpec(("mha", "mla"), ("second_reader", "pre_rotation_reader"), is_neox=True),
                CacheLayout("chunked", "flash"), settings=FusionSettings(level=3)),
    # the rotated k also scattered (copied) into a buffer of the layer's own that another op reads: no write-back
    CompileCase(ModelSpec(("mha", "mla"), ("scattered_copy_reader",) * 2, rope="native")),
    # what must stay unfused: a rope no pattern covers; a split point; a format not fusable; O1
    CompileCase(ModelSpec(("mla", "mha"), ("unsupported_rope", "plain"), rope="deepseek_native"),
                settings=FusionSettings(splitting_ops=("mla_fuse::unified_kv_cache_update",))),
    CompileCase(ModelSpec(("mla",), ("plain",)), kv_cache_dtype="fp8_e5m2", fp8_storage="float8",
                settings=FusionSettings(fusable_kv_cache_dtypes=("auto", "fp8"))),
    CompileCase(ModelSpec(("mha", "mla"), ("plain", "plain"), rope="native"), settings=FusionSettings(level=1)),
    # graph shapes the utility passes meet (docs/PASSES.md, "Situations and graph shapes"): duplicate splits
    # of one tensor along the same dim (the re-splits of a packed qkv after the custom-op rope) and along two
    # dims, fused;
    CompileCase(ModelSpec(("mha", "mla"), ("splits_along_two_dims",) * 2)),
    # a second split of a scattered buffer; the other readers in the layer kinds the examples above lack
    CompileCase(ModelSpec(("mha", "mla"), ("second_split_reader",) * 2, is_neox=True), CacheLayout("chunked", "flash")),
    CompileCase(ModelSpec(("mla", "mha", "mha"), ("second_reader", "pre_rotation_reader", "unsupported_rope"))),
    # the real path: Inductor, dynamic tokens, K/V views of one tensor in an HND pool, one FX cache hit
    CompileCase(ModelSpec(("mla", "mha"), ("plain", "plain"), rope="deepseek_native", is_neox=True),
                CacheLayout("chunked", "flash", hnd=True), "fp8", fp8_storage="float8", tokens=4, second_tokens=6,
                padded=(1,), backend="inductor"),
    # float32 on Inductor: its C++ sum for the MLA layer's RMSNorm adds in another order than ATen's, so the
    # compiled step differs from eager with or without the passes; judged against Inductor at O0 (issue 47's case)
    CompileCase(ModelSpec(("mha", "mla"), ("unsupported_rope", "plain"), hidden=8, dtype="float32",
                          shared_rope=True, mla=MlaGeometry(heads=2, nope=8, rope_dim=8, latent=20, v_dim=8),
                          mha=MhaGeometry(heads=1, kv_heads=1, head_size=8, rotary_dim=8), seed=519790),
                kv_cache_dtype="auto", block_size=4, tokens=4, padded=(0, 2, 3), backend="inductor", dynamic=False,
                seed=11905230),
    # ... and with static shapes, the native MLA rope and a pre-rotation reader beside a fused MHA layer
    CompileCase(ModelSpec(("mla", "mha", "mla"), ("plain", "plain", "pre_rotation_reader"), rope="native",
                          mha=MhaGeometry(heads=3, kv_heads=1, head_size=12, rotary_dim=8)),
                CacheLayout("separate", "flashinfer"), tokens=3, dynamic=False, backend="inductor",
                settings=FusionSettings(level=3)),
]

CI_EXAMPLES = 16
# The gpu profile's 200 examples are for the kernel properties, whose examples a GPU makes cheap; an
# example here is host work (dynamo, the passes, Inductor's compile) that a GPU does not speed up:
# 2.1 s a light example on a 2-core Xeon (mean of 20 drawn), a CUDA Inductor one estimated at 5-15 s
# (ci/gpu_compile_check.py's larger decoder compiled in 7.5-13.5 s on an H200), so 200 examples at
# the profile's 25% Inductor share would hold one xdist worker 10-18 minutes, past the whole
# profile's 8-minute target on a 16-core GPU runner. 60 (about 15 on CUDA Inductor, plus the
# explicit ones) take an estimated 3-6 minutes there; the nightly profile keeps its 2000
# (docs/PASSES.md, "Tests"; the gpu job's verify step prints the slowest tests).
GPU_EXAMPLES = 60
EXAMPLES = {"ci": CI_EXAMPLES, "gpu": GPU_EXAMPLES}


@pytest.fixture(scope="module", autouse=True)
def passes_run_on_our_kernels(request):
    """The passes insert mla_fuse's own ops, so these properties check the ``triton`` implementation only."""
    spec = resolve_spec(request.config.getoption("mla_fuse_impl"))
    if spec != PASSES_IMPLEMENTATION:
        pytest.skip(f"compile passes call mla_fuse.ops (the triton implementation); --mla-fuse-impl={spec} does not apply")


def budget(test):
    """The ci and gpu profiles' example counts for this property (the profile is loaded before collection)."""
    examples = EXAMPLES.get(profiles.current())
    return test if examples is None else settings(max_examples=examples)(test)


EXAMPLE_TIMEOUT_FACTOR = 5  # an Inductor example compiles twice (C++): longer than a kernel example


@pytest.mark.mla_fuse(timeout_factor=EXAMPLE_TIMEOUT_FACTOR)
@budget
@examples(EXPLICIT)
@given(case=compile_cases())
def test_passes_fuse_exactly_where_allowed_bitwise_and_copy_free(mla_fuse, case):
    """The passes fuse exactly where CONTRACT §6 allows, the compiled step equals eager bit for bit,
    and no cache is copied (module docstring)."""
    mla_fuse.example(case, check_planted)
