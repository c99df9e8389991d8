"""report.json schema 2 (docs/REPORT.md): its parts from synthetic outcomes and maps, without a run
(``commands/report/document.py``, ``commands/report/environment.py``), and the recorder's count of the
examples per feature value that those parts sum."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from xml.etree import ElementTree

from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.commands.report import environment
from mla_fuse_conformance.commands.report import document as report_json
from mla_fuse_conformance.commands.conformance_map.property_map import Cell, PropertyMap
from mla_fuse_conformance.commands.verify import summary
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS
from mla_fuse_conformance.running.harness import property_named
from mla_fuse_conformance.running.recording import OUTCOMES_FILE, Recorder
from mla_fuse_conformance.running.session_report import SessionReport

MLA_WRITE = "test_mla:test_mla_cache_write_matches_reference"
NODE = "properties/test_mla.py::test_mla_cache_write_matches_reference"
pytest_plugins = ["pytester"]


def metrics(spec: str, axes: dict, **counts) -> dict:
    return {"impl": spec, "operations": ["concat_and_cache_mla"], "examples": 3, "axes": axes, **counts}


def test_coverage_sums_the_tests_counts_and_lists_a_declared_value_no_example_had_with_0():
    impl = load_implementation("triton")
    outcomes = [{"nodeid": NODE, "outcome": "passed",
                 "metrics": metrics("triton", {"dtype": {"bfloat16": 2}, "tokens": {"0": 1, "1": 1}},
                                    saturation_cases=1, padded_slot_cases=2)},
                {"nodeid": NODE + "x", "outcome": "passed",
                 "metrics": metrics("triton", {"dtype": {"bfloat16": 1, "float16": 1}}, saturation_cases=2)},
                {"nodeid": NODE, "outcome": "passed", "metrics": metrics("other", {"dtype": {"float32": 5}})}]
    found = report_json.coverage(outcomes, impl, [])
    assert found["axes"]["dtype"] == {"float32": 0, "bfloat16": 3, "float16": 1}  # float32: its examples reach it
    assert found["axes"]["NaN inputs"] == {"no": 0, "yes": 0}  # reachable, no example counted
    assert found["events"] == {"fp8 saturation": 3, "padded slot": 2, "NaN input": 0, "short slot_mapping": 0,
                               "empty batch": 1}
    assert "value head size" not in found["axes"]  # a flash axis: no MLA example reaches it
    lines = report_json.coverage_lines(found)
    assert lines[-1].startswith("  exercised by no example: dtype float32,") and "NaN input," in lines[-1]


def test_a_value_the_implementation_does_not_declare_is_not_listed_with_0(tmp_path, monkeypatch):
    (tmp_path / "bf16_only.py").write_text(
        "from mla_fuse import ops\nfrom mla_fuse_conformance.contract.capabilities import Capabilities\n"
        "class Bf16:\n    concat_and_cache_mla = staticmethod(ops.concat_and_cache_mla)\n"
        "    capabilities = Capabilities(dtypes=('bfloat16',))\n    version = '1.2.3'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    impl = load_implementation("bf16_only:Bf16")
    outcomes = [{"nodeid": NODE, "outcome": "passed", "metrics": metrics(impl.spec, {"dtype": {"bfloat16": 4}})}]
    assert report_json.coverage(outcomes, impl, [])["axes"]["dtype"] == {"bfloat16": 4}
    described = environment.implementation(impl, [])
    assert described["version"] == "1.2.3" and described["module_path"] == str(tmp_path / "bf16_only.py")
    assert described["signatures"] == {"concat_and_cache_mla": "checked"}
    unchecked = environment.implementation(dataclasses.replace(impl, unchecked=("concat_and_cache_mla",)), [])
    assert unchecked["signatures"] == {"concat_and_cache_mla": "not readable"}


def test_the_version_comes_from_the_adapters_distribution_else_is_null(tmp_path, monkeypatch):
    assert environment.implementation(load_implementation("triton"), [])["version"] == \
        environment.package_version("mla_fuse")
    (tmp_path / "loose_adapter.py").write_text("from mla_fuse import ops\nclass A:\n"
                                               "    concat_and_cache_mla = staticmethod(ops.concat_and_cache_mla)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert environment.implementation(load_implementation("loose_adapter:A"), [])["version"] is None


def deployment_line(name: str, operation: str, outcome: str, **extra) -> dict:
    return {"nodeid": f"properties/test_deployments.py::test_{operation}_in_deployment[{name}]",
            "outcome": outcome, "duration": 1.5, **extra}


def test_one_verdict_per_deployment_from_its_outcome():
    known = DEPLOYMENTS[0]
    operation = known.operations[0]
    failure = {"property": "test_deployments:x", "kind": "crashed (SIGSEGV)", "file": "/tmp/f.json", "features": {}}
    outcomes = [deployment_line(known.name, operation, "passed"),
                deployment_line(known.name, "concat_and_cache_mla", "skipped",
                                reason="not supported (declared): dtype float16"),
                deployment_line("mine", "rotary_embedding", "failed", failure=failure),
                deployment_line("mine-2", "rotary_embedding", "failed", failure=dict(failure, kind="hung (120 s)")),
                deployment_line("mine-3", "rotary_embedding", "failed", failure=dict(failure, kind="wrong result")),
                {"nodeid": NODE, "outcome": "passed"}]
    found = report_json.deployments(outcomes, [])
    assert [(d["name"], d["operation"], d["verdict"]) for d in found] == [
        (known.name, operation, "pass"), (known.name, "concat_and_cache_mla", "not supported (declared)"),
        ("mine", "rotary_embedding", "crash"), ("mine-2", "rotary_embedding", "hang"),
        ("mine-3", "rotary_embedding", "fail")]
    assert known.preset in found[0]["source"] and found[2]["source"] == "user" and found[0]["seconds"] == 1.5
    assert found[2]["replay"]["file"] == "/tmp/f.json" and found[0]["replay"] is None
    assert report_json.coverage(outcomes, load_implementation("triton"), found)["deployments"] == {
        "run": 4, "passed": 1, "not supported (declared)": 1}


def test_a_deployment_skipped_as_declared_is_counted_as_declared_from_what_pytest_records(pytester, tmp_path):
    """The outcomes a real pytest run records (``running/session_report.py``), not hand-written lines: pytest
    holds a skip's text as ``"Skipped: <text>"``; recorded as such, the deployments skipped as declared were
    counted as plain skips (a run's summary said "13 run, 13 passed, 0 not supported (declared)" while 12
    more were listed with the declared reason)."""
    name = DEPLOYMENTS[0].name
    declared = report_json.UNSUPPORTED + ": style gptj"
    pytester.makepyfile(test_deployments=f"""
        import pytest

        @pytest.mark.parametrize("case", [{name!r}, "mine"])
        def test_rotary_embedding_in_deployment(case):
            if case == "mine":
                pytest.skip("no GPU")
            pytest.skip({declared!r})

        def test_rotary_embedding_matches_reference():
            pass
        """)
    pytester.inline_run("-p", "no:randomly", "-p", "no:cacheprovider", plugins=[SessionReport(None, tmp_path)])
    outcomes = summary.read_outcomes(tmp_path / OUTCOMES_FILE)
    assert [line["outcome"] for line in outcomes] == ["skipped", "skipped", "passed"]
    found = report_json.deployments(outcomes, [])
    assert [(d["name"], d["verdict"], d["reason"]) for d in found] == [
        (name, report_json.UNSUPPORTED, declared), ("mine", "skipped", "no GPU")]
    counted = report_json.coverage(outcomes, load_implementation("triton"), found)["deployments"]
    assert counted == {"run": 0, "passed": 0, report_json.UNSUPPORTED: 1}
    assert f"  deployments: 0 run, 0 passed, 1 {report_json.UNSUPPORTED}" in report_json.coverage_lines(
        dict(axes={}, events={}, deployments=counted))


def test_cells_are_flattened_with_a_stable_id_and_an_absolute_replay(tmp_path):
    replay = tmp_path / "cell.json"
    replay.write_text(json.dumps({"impl": "triton"}))
    diagnosis = {"fields": [], "relations": {}, "condition": [["relation", "q start 16-byte aligned", "no"]],
                 "rate": [3, 4], "pair": {"field": "q offset", "passing": "8", "failing": "1"}}
    first = Cell({"dtype": "bfloat16"}, "crashed (SIGSEGV), not the same on replay", "boom", str(replay), diagnosis)
    second = Cell({"dtype": "float16"}, "wrong result", "off by one", str(replay))
    found = report_json.cells([PropertyMap("test_x:test_y", ("rotary_embedding",), [first, second], {}, 9, True)])
    assert [cell["id"] for cell in found] == ["test_x:test_y | crashed (SIGSEGV) | q start 16-byte aligned: no",
                                              "test_x:test_y | wrong result | dtype float16"]
    assert found[0]["status"] == "partial" and found[0]["pair"]["field"] == "q offset" and found[1]["status"] is None
    assert found[0]["replay"]["file"] == str(replay) and str(replay) in found[0]["replay"]["command"]
    assert found[0]["replay"]["reproduced"] is None


def test_the_cpu_flags_come_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16 avx512_bf16\n"
                       "processor\t: 1\nmodel name\t: Some Xeon\n")
    assert environment.cpu(cpuinfo) == {"model": "Some Xeon", "flags": ["avx2", "avx512f", "avx512_bf16", "amx_bf16"]}
    assert environment.cpu(tmp_path / "absent")["flags"] == []
    found = environment.environment()
    assert found["backend"] in ("interpreter", "gpu") and found["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert found["device"]["kind"] in ("cpu", "cuda") and all(found[name] for name in ("torch", "hypothesis"))


def test_the_junit_file_carries_the_environment(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text('<testsuites><testsuite name="pytest"><testcase name="t"/></testsuite></testsuites>')
    found = environment.environment()
    report_json.junit_properties(path, found, {"spec": "triton", "version": None})
    properties = {p.get("name"): p.get("value") for p in ElementTree.parse(path).iter("property")}
    assert properties["mla_fuse.implementation"] == "triton" and properties["mla_fuse.torch"] == found["torch"]
    assert properties["mla_fuse.cpu.flags"] == " ".join(found["cpu"]["flags"])


def test_the_recorder_counts_each_examples_feature_values():
    prop, impl = property_named(MLA_WRITE), load_implementation("reference")
    recorder = Recorder()
    recorder.stats_for(prop, impl)
    for case in strategies.edge_cases("mla"):
        recorder.starting(prop, impl, "cpu", case)
    record = recorder.stats.as_record("passed")
    tokens = record["axes"]["tokens"]
    assert sum(tokens.values()) == len(strategies.edge_cases("mla")) and tokens.get("0") and tokens.get("1")
    assert json.loads(json.dumps(record))["axes"] == record["axes"]


def test_the_pairs_of_an_interactions_property_that_ran_are_stated_with_its_outcome():
    from mla_fuse_conformance.cases import interactions

    line = {"nodeid": "property_tests/properties/test_interactions.py::test_fused_mla_interactions", "when": "call",
            "outcome": "failed", "metrics": {"operations": ["concat_and_cache_mla_rope_fused"]}}
    other = {"nodeid": "property_tests/properties/test_mla.py::test_fused_mla_matches_reference", "when": "call",
             "outcome": "passed", "metrics": {"operations": ["concat_and_cache_mla_rope_fused"]}}
    pairs = report_json.pairs_coverage([line, other])
    assert pairs == {"concat_and_cache_mla_rope_fused": {
        "strength": 2, "cases": len(interactions.committed_rows("concat_and_cache_mla_rope_fused")),
        "pairs": interactions.committed_pairs("concat_and_cache_mla_rope_fused"), "outcome": "failed"}}
    assert report_json.pairs_coverage([other]) == {}
