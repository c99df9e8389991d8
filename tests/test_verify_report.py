"""What ``mla-fuse verify`` runs and prints for an adapter with one operation (commands/verify/run.py).

The properties of operations an adapter does not provide are deselected at collection (they
would only skip), the large-address cases are left out of the ``dev`` profile and the report
says so, a passing run prints no warning that is not the user's, and each table of the report
has a key.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

from mla_fuse_conformance.commands.verify import console, summary
from mla_fuse_conformance.commands.verify import run as verify
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.declarations.third_party_warnings import FILTERWARNINGS
from mla_fuse_conformance.contract.applicable import only_skips

ROOT = pathlib.Path(__file__).resolve().parents[1]
ONE_OPERATION = '''
from mla_fuse import ops


class OneOp:
    concat_and_cache_mla = staticmethod(ops.concat_and_cache_mla)
'''


@pytest.fixture
def one_op(tmp_path, monkeypatch):
    (tmp_path / "one_op.py").write_text(ONE_OPERATION)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_only_the_properties_that_would_skip_are_deselected(one_op):
    impl = load_implementation("one_op:OneOp")
    required = load_implementation("one_op:OneOp", ("rotary_embedding",))
    assert not only_skips(pytest.mark.mla_fuse("concat_and_cache_mla").mark, impl)
    assert only_skips(pytest.mark.mla_fuse("concat_and_cache_mla", bad_input=True).mark, impl)  # checks_inputs no
    assert only_skips(pytest.mark.mla_fuse("rotary_embedding").mark, impl)
    assert only_skips(pytest.mark.mla_fuse("concat_and_cache_mla_rope_fused", "concat_and_cache_mla").mark, impl)
    assert not only_skips(pytest.mark.mla_fuse("rotary_embedding").mark, required)  # it must fail instead
    assert not only_skips(pytest.mark.mla_fuse(timeout_factor=4).mark, impl) and not only_skips(None, impl)


def test_a_one_operation_verify_runs_its_properties_only_and_prints_no_foreign_warning(one_op):
    """A short selection (one property, few examples): the suite's modules are all imported at
    collection, Inductor's included, as in a full run."""
    env = _child_environment(PYTHONPATH=str(one_op))
    env.pop("CI", None)
    env["GITHUB_STEP_SUMMARY"] = str(one_op / "step_summary.md")
    result = subprocess.run(
        [sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", "one_op:OneOp", "--profile", "dev",
         "-n", "0", "--map-rounds", "0", "--", "-k", "cache_write_matches_reference or past_the_threshold or passes",
         "--hypothesis-seed=0"],
        capture_output=True, text=True, cwd=one_op, env=env, timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "warning" not in out.lower().replace("warnings summary", "") and "Traceback" not in out, out
    assert "warnings summary" not in out, out
    outcomes = summary.read_outcomes(one_op / ".mla_fuse_reports" / "outcomes.jsonl")
    ran = {line["nodeid"].rpartition("/")[2]: line for line in outcomes}
    assert [nodeid for nodeid, line in ran.items() if line["outcome"] == "passed"] == [
        "test_mla.py::test_mla_cache_write_matches_reference"], out  # test_flash's is deselected
    assert all(line["outcome"] == "skipped" and "past_the_threshold" in nodeid
               for nodeid, line in ran.items() if line["outcome"] != "passed"), out
    assert ran["test_large_addresses.py::test_cache_entries_past_the_threshold[mla-auto]"]["reason"].startswith(
        "large addresses: cases past 2^31"), out  # the skip's own text, without pytest's "Skipped: "
    assert " deselected" in out, out
    assert "not run: large addresses: cases past 2^31 elements" in out, out
    assert "not run: the properties of rotary_embedding, concat_and_cache_mla_rope_fused" in out, out
    assert "not run: compile passes" in out and not any("compile_passes" in nodeid for nodeid in ran), out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(("concat", "rotary", "reshape", "rope"))]
    assert rows == ["concat_and_cache_mla"], out
    assert_schema_2(json.loads((one_op / ".mla_fuse_reports" / "report.json").read_text()), result.stdout)
    views = [one_op / ".mla_fuse_reports" / name for name in ("report.html", "summary.md")]
    assert f"report: {views[0].parent / 'report.json'}, {views[0]}, {views[1]}, JUnit: " in out, out
    assert (one_op / "step_summary.md").read_text() == views[1].read_text() + "\n"


def assert_schema_2(report: dict, printed: str) -> None:
    """report.json schema 2 (docs/REPORT.md) of a passing dev run of ``one_op:OneOp``, and the printed
    report: what ran first, the coverage last."""
    assert report["schema"] == 2 and report["verdict"] == "PASS", report
    run = report["run"]
    assert run["profile"] == "dev" and run["seed_policy"].startswith("random, database ") and run["exit_code"] == 0
    assert " verify --impl one_op:OneOp " in run["command"] and run["phases"]["properties"] <= run["seconds"]
    assert report["implementation"]["spec"] == "one_op:OneOp" and report["implementation"]["version"] is None
    assert report["implementation"]["signatures"] == {"concat_and_cache_mla": "checked"}
    assert report["environment"]["backend"] == "interpreter" and report["environment"]["device"]["kind"] == "cpu"
    axes = report["coverage"]["axes"]
    assert sum(axes["dtype"].values()) == report["operations"]["concat_and_cache_mla"]["examples"], axes
    assert report["coverage"]["events"]["padded slot"] == report["operations"]["concat_and_cache_mla"]["padded_slot_cases"]
    assert report["cells"] == [] and report["failures"] == [] and report["deployments"] == []
    lines = printed.splitlines()
    assert lines[0].startswith("mla-fuse verify: one_op:OneOp (OneOp) version unknown, dev profile"), printed
    assert lines[1].startswith("mla-fuse verify: device: cpu") and "vector flags" in lines[3], printed
    tail = printed[printed.rindex("\ncoverage (examples per feature value"):]
    assert "  events: fp8 saturation " in tail and tail.rstrip().endswith("verdict: PASS"), tail


def test_the_third_party_filters_are_declared_once_and_used_by_this_repository():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert set(FILTERWARNINGS) <= set(settings.get("filterwarnings", ())), "pyproject.toml misses a filter"
    assert all(line.startswith("ignore:") and line.count(":") >= 3 for line in FILTERWARNINGS)  # message and module


def test_the_table_has_a_key_and_names_the_rows_of_no_single_operation():
    outcomes = [
        {"nodeid": "properties/test_compile_passes.py::test_passes_fuse", "outcome": "passed", "metrics": None},
        {"nodeid": "properties/test_large_addresses.py::test_query_rows_a_huge_stride_apart", "outcome": "skipped"},
        {"nodeid": "properties/test_mla.py::test_mla_cache_write_matches_reference", "outcome": "passed",
         "metrics": {"impl": "x", "operations": ["concat_and_cache_mla"], "examples": 3, "worst_rope_ulps": 680}},
    ]
    summaries = summary.summarize(outcomes, "x")
    assert sorted(summaries) == ["addresses past 2^31", "compile passes (Inductor)", "concat_and_cache_mla"]
    table = console.format_table(summaries).splitlines()
    assert table[2].startswith("concat_and_cache_mla") and table[3].startswith("key: rope bound used")
    key = " ".join(table[3:table.index("")])
    assert "passes <= 1" in key and "rope ulps" in key and "not a criterion" in key and "fp8 codes" in key
    others = table[table.index("") + 1:]  # issue 31 item 7: rows of no operation read as operations: a table apart
    assert others[0].startswith("other checks (no one operation's examples)")
    assert [line.split("  ")[0] for line in others[2:]] == ["addresses past 2^31", "compile passes (Inductor)"]
    assert not any(line.startswith(("addresses", "compile passes")) for line in table[:table.index("")])



HEAP_TEST = """
def test_leaves_a_large_heap(held):  # as Inductor's and Triton's caches do
    held.extend([i] for i in range(200_000))
"""
HEAP_CONFTEST = """
import atexit, gc, os, pathlib
import pytest
import _pytest.unraisableexception as unraisable

HELD = []
LOG = pathlib.Path(os.environ["FROZEN_LOG"])
collect = unraisable.gc_collect_harder


@pytest.fixture
def held():
    return HELD


def frozen_at_pytests_collection(iterations):  # pytest's last collection, within execnet's grace
    if os.environ.get("PYTEST_XDIST_WORKER"):
        LOG.with_suffix(".collection").write_text(str(gc.get_freeze_count()))
    collect(iterations)


unraisable.gc_collect_harder = frozen_at_pytests_collection
if os.environ.get("PYTEST_XDIST_WORKER"):  # what the interpreter's exit collects (nanobind checks leaks)
    atexit.register(lambda: LOG.with_suffix(".exit").write_text(str(gc.get_freeze_count())))
"""


def _child_environment(**extra) -> dict:
    """This environment for a child pytest session, less what an xdist worker running this test
    sets (a child controller that inherits PYTEST_XDIST_WORKER takes itself for a worker)."""
    return {**{name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST")}, **extra}


def test_an_xdist_worker_leaves_its_heap_to_the_end_of_the_process(tmp_path):
    """execnet interrupts a worker (SIGINT) whose teardown outlasts 5 s; a full garbage collection of
    the heap Inductor leaves took that long on a loaded machine, and the KeyboardInterrupt landed in
    hypothesis' gc callback, printed as a PytestUnraisableExceptionWarning after a passing run. The
    plugin freezes a worker's heap when its session is over, so pytest's last collection skips it, and
    unfreezes it after that, so the interpreter's exit collects it (nanobind reports what it does not)."""
    (tmp_path / "test_heap.py").write_text(HEAP_TEST)
    (tmp_path / "conftest.py").write_text(HEAP_CONFTEST)
    log = tmp_path / "frozen.log"
    result = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider",
                             "--mla-fuse-impl=reference", "test_heap.py"], capture_output=True, text=True,
                            cwd=tmp_path, env=_child_environment(FROZEN_LOG=str(log)), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert int(log.with_suffix(".collection").read_text()) >= 200_000, "pytest's last collection went over the heap"
    assert int(log.with_suffix(".exit").read_text()) == 0, "the heap was left frozen to the interpreter's exit"


def test_the_compile_pass_module_is_not_even_collected_for_another_implementation(tmp_path):
    from mla_fuse_conformance.properties import test_compile_passes

    ignore = f"--ignore={test_compile_passes.__file__}"
    assert ignore in verify.pytest_command("one_op:OneOp", "dev", tmp_path, "auto", (), [])
    assert ignore not in verify.pytest_command("triton", "dev", tmp_path, "auto", (), [])
