"""Each compile-pass example is a pure function of its case (docs/PASSES.md, "Purity of examples").

The state an example leaves in the process either is reset or isolated per example (dynamo:
``torch._dynamo.reset()`` before each compile; match counts: per compiled model, read as the
change of Inductor's counters around each compile; recorded graphs: per backend; the FX graph
cache: a cache key of the example's own) or is meant to persist and must not change an outcome:
the patterns traced once per process (``pattern_utils._TRACED``) and Inductor's on-disk FX graph
cache. These tests run cases cold (patterns cleared), warm (after other examples traced them) and
twice, and require the same observation each time: problems, counts, cache hits and the post-pass
graph (``observe_compile_case``). A planted pass bug fails its case on every call, so hypothesis
cannot see a failure that passes on its replay (a ``FlakyFailure``).
"""

from __future__ import annotations

import pytest

from mla_fuse.passes import pattern_utils
from mla_fuse_conformance.compile_passes.mutants import PASS_MUTANTS
from mla_fuse_conformance.compile_passes.checks import observe_compile_case
from mla_fuse_conformance.properties.test_compile_passes import EXPLICIT

LIGHT_HYBRID, LIGHT_READERS = EXPLICIT[0], EXPLICIT[1]
# native rope, nothing fused (O1): runs to its end under a planted fusion bug
LIGHT_NATIVE_O1 = next(case for case in EXPLICIT if case.backend == "light" and case.model.rope == "native"
                       and case.settings.level == 1)
INDUCTOR_DYNAMIC = next(case for case in EXPLICIT if case.backend == "inductor" and case.dynamic)


def test_a_light_example_observes_the_same_cold_warm_and_after_other_examples():
    pattern_utils.clear_pattern_cache()
    cold = observe_compile_case(LIGHT_HYBRID)  # traces its patterns
    assert cold["problems"] == [] and any(counts["defunctionalization"] for counts in cold["counts"])
    observe_compile_case(LIGHT_READERS)  # another example in between (other layers, other patterns)
    warm = observe_compile_case(LIGHT_HYBRID)  # its patterns come from the process-wide cache
    assert warm == cold


def test_a_planted_pass_bug_fails_its_case_on_every_call():
    """What hypothesis does with a failure: it runs the case again (shrinking, then once more to
    report it). A pass bug must fail it each time, first call of the process or not."""
    with PASS_MUTANTS["swaps_q_and_k_outputs"].active():
        first = observe_compile_case(LIGHT_HYBRID)
        observe_compile_case(LIGHT_NATIVE_O1)
        again = observe_compile_case(LIGHT_HYBRID)
    assert first["problems"] and again == first


def test_an_inductor_example_misses_then_hits_the_fx_graph_cache_every_time():
    """The FX graph cache persists (on disk, across processes): each example compiles under a key of
    its own, so its first compile is a miss and its second a hit, however often the case runs."""
    first = observe_compile_case(INDUCTOR_DYNAMIC)
    again = observe_compile_case(INDUCTOR_DYNAMIC)
    assert first["problems"] == [] and again == first  # problems include a second compile that is not a hit
    assert not any(first["cache_hits"])  # the example's first compile: a miss, on every call


def test_a_compile_failure_record_holds_the_case_and_names_the_planted_pass_bug(tmp_path, monkeypatch):
    """The failure file of a compile-pass example is the kernel properties' format (its case as JSON,
    no hypothesis blob), names its property in the registry ``mla-fuse repro`` reads, and the planted
    pass mutant, which ``mla-fuse repro`` plants again."""
    import json

    import torch

    from mla_fuse_conformance.cases import types as case_types
    from mla_fuse_conformance.contract.implementation import load_implementation
    from mla_fuse_conformance.running import harness, recording
    from mla_fuse_conformance.compile_passes import checks as passes

    monkeypatch.setenv(recording.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(passes.PASS_MUTANT_ENV, "swaps_q_and_k_outputs")  # as if planted at import
    monkeypatch.setattr(passes, "check_compile_case", lambda case: (_ for _ in ()).throw(AssertionError("planted")))
    prop = harness.property_named("test_compile_passes:test_passes_fuse_exactly_where_allowed_bitwise_and_copy_free")
    recorder = recording.Recorder()
    with pytest.raises(AssertionError):
        prop.run(load_implementation("triton"), torch.device("cpu"), LIGHT_HYBRID, recorder=recorder)
    failure = recorder.last_failure
    path = recording.save_failure(failure, "test_compile_passes.py::" + prop.name.partition(":")[2], "mla_fuse.dev")
    record = json.loads(path.read_text())
    assert record["pass_mutant"] == "swaps_q_and_k_outputs" and record["impl"] == "triton"
    assert record["kind"] == "wrong result" and record["error"] == "planted"
    assert case_types.from_jsonable(record["case"]) == LIGHT_HYBRID
    assert harness.property_named(record["property"]).name == prop.name
    assert "-m mla_fuse_conformance repro" in record["replay"]
