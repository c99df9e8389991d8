"""What the compile-pass property compares on Inductor: the compiled step with the passes against the
same model compiled by Inductor at O0 (no pass), not against eager (docs/PASSES.md, "What the
property compares").

Inductor's C++ code for what no pass touches need not give eager's float32 bits (its sum for an
RMSNorm's mean adds in another order than ATen's), and which graphs differ depends on the CPU. The
tests plant such a difference where it is the same on every CPU: Inductor's lowering of ``rsqrt``
(the MLA layer's RMSNorm) scaled by ``1 + 2^-10``, a change no pass makes. The property must not
blame the passes for it, and must still catch a planted pass bug in the same graph.
"""

from __future__ import annotations

import contextlib
import uuid

import torch
from torch._inductor import lowering

import mla_fuse.compile as mc
from mla_fuse_conformance.compile_passes.checks import case_caches, case_step, observe_compile_case
from mla_fuse_conformance.compile_passes.models import build_model, run, same_weights
from mla_fuse_conformance.compile_passes.mutants import PASS_MUTANTS
from mla_fuse_conformance.properties.test_compile_passes import EXPLICIT

# issue 47's case: float32, an MHA layer with a rope no pattern covers, a fused MLA layer, Inductor, static
FLOAT32_INDUCTOR = next(case for case in EXPLICIT if case.backend == "inductor" and case.model.dtype == "float32")
RSQRT = torch.ops.aten.rsqrt.default


@contextlib.contextmanager
def inductor_rsqrt_scaled():
    """Inductor computes ``rsqrt(x) * (1 + 2^-10)`` where eager computes ``rsqrt(x)``."""
    original = lowering.lowerings[RSQRT]
    multiply = lowering.lowerings[torch.ops.aten.mul.Tensor]
    lowering.lowerings[RSQRT] = lambda x: multiply(original(x), 1 + 2 ** -10)
    try:
        yield
    finally:
        lowering.lowerings[RSQRT] = original


def eager_and_inductor_at_o0(case) -> tuple[torch.Tensor, torch.Tensor]:
    """The model output of the case's step, eager and compiled by Inductor without any pass."""
    model = build_model(case.model, use_custom_op=True)
    compiled = mc.compile(same_weights(model, build_model(case.model, use_custom_op=True)), backend="inductor",
                          level=0)
    torch._dynamo.reset()
    outputs = []
    for runnable in (model, compiled):
        with torch.compiler.config.patch(cache_key_tag=f"mla_fuse-test-{uuid.uuid4().hex}"):
            outputs.append(run(runnable, case_caches(case).layers, case_step(case))[0])
    return outputs[0], outputs[1]


def test_an_inductor_difference_without_any_pass_is_not_blamed_on_the_passes():
    with inductor_rsqrt_scaled():
        eager, compiled = eager_and_inductor_at_o0(FLOAT32_INDUCTOR)
        assert not torch.equal(eager, compiled), "the planted Inductor difference did not change the compiled bits"
        observed = observe_compile_case(FLOAT32_INDUCTOR)
    assert observed["problems"] == []


def test_a_pass_bug_in_the_same_graph_is_still_caught():
    with inductor_rsqrt_scaled(), PASS_MUTANTS["drops_the_q_write_back"].active():
        problems = observe_compile_case(FLOAT32_INDUCTOR)["problems"]
    assert any(problem.startswith("compiled != Inductor at O0 (no pass)") for problem in problems), problems
