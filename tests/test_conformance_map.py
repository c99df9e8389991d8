"""The conformance map, limit checks, crash survival and replay (commands/conformance_map/, running/executor.py, commands/repro/, plugin.py).

The adapters here are written into a temporary directory, as a user's would be, and loaded by
``module:attr`` spec from there (the executor's children import them the same way).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch

from mla_fuse_conformance.running import recording
from mla_fuse_conformance.running import replay as repro
from mla_fuse_conformance.cases.types import PositionSpec, RopeCase, TableSpec
from mla_fuse_conformance.running.executor import Crashed, Executor, Hung, RaisedInChild
from mla_fuse_conformance.running.harness import property_named
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.commands.conformance_map.limits import check_limit
from mla_fuse_conformance.commands.conformance_map.property_map import map_property
from test_pasted_commands import fresh_shell, printed

ROPE_PROPERTY = "test_rotary_embedding:test_rotary_embedding_matches_reference"
ADAPTERS = '''
import ctypes
from mla_fuse_reference.adapter import ReferenceImplementation


class OnlyRope(ReferenceImplementation):
    concat_and_cache_mla = concat_and_cache_mla_rope_fused = None
    reshape_and_cache_flash = rope_and_reshape_and_cache_flash = None


class SecondHeadsWrong(OnlyRope):
    """Rank-3 queries with more than one head: heads past the first scaled (a planted bug)."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        if query.dim() == 3 and query.size(1) > 1:
            query[:, 1:] *= 1.5


class CrashesOnRank2(OnlyRope):
    """Reads address 0 (SIGSEGV) for rank-2 queries."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if query.dim() == 2 and query.size(0) > 0:
            ctypes.string_at(0)
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class HangsOnRank2(OnlyRope):
    """Deadlocks (a lock taken twice) on rank-2 queries, as a kernel on a corrupted OpenMP barrier does."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if query.dim() == 2 and query.size(0) > 0:
            import threading
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class DeclaresInt64Only(OnlyRope):
    capabilities = {"position_dtypes": ("int64",)}  # handles int32 too: the check notes it


class RejectsInt32(DeclaresInt64Only):
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if positions.dtype != __import__("torch").int64:
            raise RuntimeError("expected scalar type Long")
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class RaisesOnRank3(OnlyRope):
    """Raises on every rank-3 query (a failure of another kind than a wrong result)."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if query.dim() == 3:
            raise RuntimeError("no rank 3 today")
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class AssertsOnRank2(OnlyRope):
    """A wrapper's own assert, as SGLang's ``assert block_size is power of 2``: it raised, nothing was judged wrong."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        assert query.dim() == 3, "query should be rank 3"
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class IgnoresInt32(DeclaresInt64Only):
    """Declares int64 positions only, and reads int32 ones as the next row, raising nothing (a silent wrong result)."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if positions.dtype != __import__("torch").int64:
            positions = (positions.long() + 1) % cos_sin_cache.size(0)
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


class WritesThenRejectsInt32(DeclaresInt64Only):
    """Declares int64 positions only; on int32 ones it zeroes the query, then raises."""
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if positions.dtype != __import__("torch").int64:
            query.zero_()
            raise RuntimeError("expected scalar type Long")
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
'''


RANK3 = RopeCase(seed=1, tokens=3, heads=2, kv_heads=1, head_size=6, dtype="bfloat16", is_neox=False,
                 table=TableSpec("plain", 4, 8))
RANK2 = dataclasses.replace(RANK3, rank=2)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A user's directory holding their adapters; the current directory while the test runs."""
    (tmp_path / "adapters_here.py").write_text(ADAPTERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path / "failures"))
    return tmp_path


def _in_process(prop, impl):
    return lambda case: prop.run(impl, torch.device("cpu"), case)


def test_the_map_finds_the_cell_of_a_planted_bug(user_dir):
    impl = load_implementation("adapters_here:SecondHeadsWrong")
    prop = property_named(ROPE_PROPERTY)
    found = map_property(prop, impl, "cpu", _in_process(prop, impl), max_examples=40)
    assert [cell.features for cell in found.cells] == [{"query rank": "3", "heads": ">1"}]
    assert found.cells[0].kind == "wrong result" and os.path.exists(found.cells[0].file)
    assert found.complete and found.passing["query rank"]["2"] > 0 and found.passing["heads"][">1"] > 0
    title = next(line for line in found.lines() if line.startswith("  fails   "))
    assert "rank 3" in title and "heads > 1: yes" in title and "wrong result" in title, found.lines()
    assert any("feature axes: query rank 3, heads >1" in line for line in found.lines())


def test_a_crashing_kernel_is_mapped_and_shrunk_like_any_failure(user_dir):
    impl = load_implementation("adapters_here:CrashesOnRank2")
    prop = property_named(ROPE_PROPERTY)
    with Executor(impl.spec, "cpu") as executor:
        found = map_property(prop, impl, "cpu", lambda case: executor.run(prop.name, case), max_examples=30)
        assert executor.crashes > 0
    assert [(cell.features, cell.kind) for cell in found.cells] == [({"query rank": "2"}, "crashed (SIGSEGV)")]
    record = json.loads(open(found.cells[0].file).read())
    assert record["kind"] == "crashed (SIGSEGV)" and record["cell"] == {"query rank": "2"}
    assert repro.replay(record) == repro.REPRODUCED
    assert repro.replay(record, impl_spec="reference") == repro.PASSED


def test_the_executor_survives_a_crash_and_reports_what_was_raised(user_dir):
    prop = property_named(ROPE_PROPERTY)
    with Executor("adapters_here:CrashesOnRank2", "cpu") as executor:
        executor.run(prop.name, RANK3)
        with pytest.raises(Crashed, match="SIGSEGV"):
            executor.run(prop.name, RANK2)
        executor.run(prop.name, RANK3)  # a new child
    int32 = RopeCase(seed=1, tokens=3, heads=1, kv_heads=1, head_size=6, dtype="bfloat16", is_neox=False,
                     table=TableSpec("plain", 4, 8), positions=PositionSpec(dtype="int32"))
    with Executor("adapters_here:RaisesOnRank3", "cpu") as executor:
        with pytest.raises(RaisedInChild, match="no rank 3 today") as raised:
            executor.run(prop.name, RANK3)
        assert raised.value.original_type == "RuntimeError"
    with Executor("adapters_here:RejectsInt32", "cpu") as executor:  # outside a declared limit: a refusal
        with pytest.raises(RaisedInChild, match="RuntimeError: expected scalar type Long") as raised:
            executor.run(prop.name, int32, within_limits=False)
        assert raised.value.original_type == "Refused"


def test_a_hung_example_is_killed_and_the_next_gets_a_new_child(user_dir, monkeypatch):
    monkeypatch.setenv("MLA_FUSE_EXAMPLE_TIMEOUT", "5")  # an honest example takes ms
    prop = property_named(ROPE_PROPERTY)
    with Executor("adapters_here:HangsOnRank2", "cpu") as executor:
        executor.run(prop.name, RANK3)
        with pytest.raises(Hung, match="no result in 5 s") as hung:
            executor.run(prop.name, RANK2)
        assert hung.value.how == "hung: no result in 5 s" and executor.process is None
        executor.run(prop.name, RANK3)
    with Executor("adapters_here:SecondHeadsWrong", "cpu") as executor:  # a wrong result: a clean child next
        executor.run(prop.name, RANK2)
        first = executor.process.pid
        with pytest.raises(AssertionError):
            executor.run(prop.name, RANK3)
        executor.run(prop.name, RANK2)
        assert executor.process.pid != first


def test_an_example_running_when_the_callers_budget_is_spent_is_killed_and_is_no_outcome(user_dir, monkeypatch):
    """``verify --map-seconds``: a hanging example is given the budget left, not its 120 s, and is
    neither a hang nor a crash; none left, no example starts. Planted: ``Executor._ask`` without
    ``budget`` waits the example's own limit and raises Hung."""
    import time

    from mla_fuse_conformance.running.executor import OutOfTime

    monkeypatch.setenv("MLA_FUSE_EXAMPLE_TIMEOUT", "60")
    prop = property_named(ROPE_PROPERTY)
    with Executor("adapters_here:HangsOnRank2", "cpu") as executor:
        executor.run(prop.name, RANK3, budget=60)  # a budget longer than the example: runs as before
        started = time.monotonic()
        with pytest.raises(OutOfTime):
            executor.run(prop.name, RANK2, budget=2)
        assert time.monotonic() - started < 30 and executor.process is None and executor.crashes == 0
        with pytest.raises(OutOfTime):
            executor.run(prop.name, RANK3, budget=0)
        assert executor.process is None  # not started
        executor.run(prop.name, RANK3)


def test_the_callers_check_stops_a_running_example_within_a_second_and_before_the_next(user_dir, monkeypatch):
    """``verify`` stopped by a signal: its handler only notes it, and the executor's ``check`` (called
    before each example and every ``CHECK_EVERY`` s while one runs) raises where the map is. Planted:
    ``Executor._wait`` without the check polls the example's whole 60 s."""
    import threading
    import time

    class Stop(BaseException):
        pass

    signalled = []

    def check():
        if signalled:
            raise Stop()

    monkeypatch.setenv("MLA_FUSE_EXAMPLE_TIMEOUT", "60")
    prop = property_named(ROPE_PROPERTY)
    with Executor("adapters_here:HangsOnRank2", "cpu", check=check) as executor:
        executor.run(prop.name, RANK3)
        started = time.monotonic()
        threading.Timer(1.0, lambda: signalled.append("SIGTERM")).start()
        with pytest.raises(Stop):
            executor.run(prop.name, RANK2)  # hangs: stopped by the check, not after 60 s
        assert time.monotonic() - started < 15 and executor.crashes == 0
        executor.kill()
        with pytest.raises(Stop):
            executor.run(prop.name, RANK3)
        assert executor.process is None  # not started


@pytest.mark.parametrize("spec, outcome, detail", [
    ("adapters_here:DeclaresInt64Only", "handled", "examples that reached it passed"),
    ("adapters_here:RejectsInt32", "refused", "RuntimeError: expected scalar type Long"),
    ("adapters_here:IgnoresInt32", "unguarded: wrong result", "wrong result"),
    ("adapters_here:WritesThenRejectsInt32", "unguarded: stray write", "rotary_embedding wrote, then raised RuntimeError"),
])
def test_a_declared_limit_is_checked_for_refusal_with_cases_just_outside_it(user_dir, spec, outcome, detail):
    """Outside a declared limit an implementation refuses (raises before writing) or it does not: a silent
    wrong result, or a write before the exception, is unguarded (a finding with its replay), never a limit
    confirmed."""
    impl = load_implementation(spec)
    prop = property_named(ROPE_PROPERTY)
    with Executor(impl.spec, "cpu") as executor:
        check = check_limit(prop, impl, lambda case: executor.run(prop.name, case, False), "rotary_embedding",
                            "positions dtype", "int32")
    assert check.outcome == outcome and detail in check.detail, check
    assert (check.file is not None) == check.unguarded
    if check.unguarded:
        assert repro.replay(repro.load(check.file)) == repro.REPRODUCED


def test_repro_says_reproduced_passed_or_could_not_run(user_dir, tmp_path):
    impl = load_implementation("adapters_here:SecondHeadsWrong")
    prop = property_named(ROPE_PROPERTY)
    found = map_property(prop, impl, "cpu", _in_process(prop, impl), max_examples=40, rounds=1)
    path = found.cells[0].file
    run = lambda *args: subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "repro", *args], capture_output=True, text=True,  # noqa: E731
                                       cwd=tmp_path)
    assert run(path).returncode == 1
    assert run(path, "--impl", "reference").returncode == 0
    missing_op = run(path, "--impl", "mutant:none")  # provides rotary_embedding: passes
    assert missing_op.returncode == 0
    for args in ([path, "--impl", "no_such_module:X"], [str(tmp_path / "absent.json")]):
        result = run(*args)
        assert result.returncode == 2 and "could not run" in result.stderr, result


def test_a_worker_crash_under_pytest_becomes_a_failure_file(user_dir):
    """pytest-xdist replaces the dead worker; the plugin turns its in-flight example into a failure
    file attributed to the property, and the rest of the session runs. Its printed replay line, pasted into
    a new shell (``env -i``) in another directory, says REPRODUCED with the recorded signal."""
    reports = user_dir / "reports"
    (user_dir / "test_after.py").write_text("def test_after_the_crash():\n    pass\n")  # collected last
    command = [sys.executable, "-m", "pytest", "--pyargs",
               f"mla_fuse_conformance.properties.test_rotary_embedding", "test_after.py",
               "--mla-fuse-impl=adapters_here:CrashesOnRank2",
               "-n", "1", "-p", "no:cacheprovider", "-q", "--hypothesis-profile=mla_fuse.ci"]
    env = dict(os.environ, MLA_FUSE_REPORT_DIR=str(reports), PYTHONPATH=str(user_dir))
    result = subprocess.run(command, capture_output=True, text=True, cwd=user_dir, env=env, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:]
    lines = [json.loads(line) for line in (reports / "outcomes.jsonl").read_text().splitlines()]
    crashed = [line for line in lines if (line.get("failure") or {}).get("kind") == "crashed"]
    assert len(crashed) == 1 and crashed[0]["failure"]["features"]["query rank"] == "2"
    assert any(line["nodeid"].endswith("test_after_the_crash") and line["outcome"] == "passed"
               for line in lines)  # the session went on
    assert "mla_fuse: reproduce this failure" in result.stdout
    replay = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "repro", crashed[0]["failure"]["file"]], capture_output=True, text=True,
                            cwd=user_dir)
    assert replay.returncode == 1 and "SIGSEGV" in replay.stdout
    # the printed replay line, pasted into a new shell (env -i) in another directory: the recorded signal
    line, _ = printed(result.stdout, "replay exactly")
    elsewhere = user_dir / "elsewhere"
    elsewhere.mkdir()
    pasted = fresh_shell(line, elsewhere, user_dir)
    assert pasted.returncode == 1 and "REPRODUCED" in pasted.stdout and "SIGSEGV" in pasted.stdout, \
        line + "\n" + pasted.stdout[-2000:] + pasted.stderr[-2000:]


def test_an_adapter_that_does_not_import_stops_pytest_with_one_line(user_dir):
    (user_dir / "broken_adapter.py").write_text("import no_such_library\n")
    result = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "mla_fuse_conformance.properties.test_mla",
                             "--mla-fuse-impl=broken_adapter:Kernels", "-p", "no:cacheprovider"],
                            capture_output=True, text=True, cwd=user_dir, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(errors) == 1, result.stderr
    assert "cannot import module 'broken_adapter'" in errors[0] and "no_such_library" in errors[0]


def test_a_hang_under_pytest_becomes_a_failure_file_with_the_stacks(user_dir):
    """The plugin's watchdog ends a worker whose example runs past $MLA_FUSE_EXAMPLE_TIMEOUT; the
    example is a "hung" failure of its cell, with where the threads were, and it replays as one."""
    reports = user_dir / "reports"
    command = [sys.executable, "-m", "pytest", "--pyargs",
               "mla_fuse_conformance.properties.test_rotary_embedding::test_rotary_embedding_matches_reference",
               "--mla-fuse-impl=adapters_here:HangsOnRank2", "-n", "1", "-p", "no:cacheprovider", "-q",
               "--hypothesis-profile=mla_fuse.ci"]
    env = dict(os.environ, MLA_FUSE_REPORT_DIR=str(reports), PYTHONPATH=str(user_dir), MLA_FUSE_EXAMPLE_TIMEOUT="10")
    result = subprocess.run(command, capture_output=True, text=True, cwd=user_dir, env=env, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:]
    lines = [json.loads(line) for line in (reports / "outcomes.jsonl").read_text().splitlines()]
    hung = [line["failure"] for line in lines if (line.get("failure") or {}).get("kind") == "hung"]
    assert len(hung) == 1 and hung[0]["features"]["query rank"] == "2", lines
    assert "no result in 10.0 s" in hung[0]["error"] and "rotary_embedding" in hung[0]["error"]  # the stack
    replay = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "repro", hung[0]["file"]], capture_output=True, text=True, cwd=user_dir,
                            env=env, timeout=300)
    assert replay.returncode == 1 and "no result in 10 s" in replay.stdout, replay.stdout + replay.stderr


def test_verify_maps_a_property_whose_worker_died_without_leaving_its_example():
    """A failed property test with no failure file (the worker died after its example, e.g. of a heap
    its kernel had corrupted) is still mapped; failure files come first, each property once."""
    from mla_fuse_conformance.properties import test_mla  # noqa: F401 registers its properties
    from mla_fuse_conformance.commands.verify.maps import failing_properties
    from mla_fuse_conformance.commands.verify.summary import summarize

    mla = "test_mla:test_mla_cache_write_matches_reference"
    outcomes = [{"nodeid": "test_rotary_embedding.py::test_rotary_embedding_matches_reference", "outcome": "failed",
                 "failure": {"property": ROPE_PROPERTY}},
                {"nodeid": f"test_mla.py::{mla.partition(':')[2]}", "outcome": "failed", "failure": None},
                {"nodeid": "test_mla.py::test_mla_cache_write_rejects_bad_input[slot_past_cache]", "outcome": "failed"},
                {"nodeid": "test_large_addresses.py::test_query_rows_a_huge_stride_apart", "outcome": "failed"},
                {"nodeid": f"test_mla.py::{mla.partition(':')[2]}", "outcome": "passed"}]
    assert failing_properties(outcomes) == [ROPE_PROPERTY, mla]
    summaries = summarize(outcomes, "vllm-cpu-amx")  # the dead worker's test counts for its operation
    assert summaries["concat_and_cache_mla"].failed == 2 and summaries["concat_and_cache_mla"].verdict == "FAIL"


def test_a_worker_that_dies_between_examples_blames_the_last_one(user_dir):
    """The allocator finds a kernel's stray write at a later ``free``, after the example has ended:
    the crash is attributed to the test's last finished example, said as such; a normal session
    leaves nothing of its examples in the failure directory."""
    (user_dir / "conftest.py").write_text('''
import os
from mla_fuse_conformance.running import recording

_finished = recording.Recorder.finished
_count = [0]

def finished(self):
    _finished(self)
    _count[0] += 1
    if os.environ.get("DIE_AFTER") and _count[0] == int(os.environ["DIE_AFTER"]):
        os.abort()  # after the third example has finished, outside any example

recording.Recorder.finished = finished
''')
    reports = user_dir / "reports"
    command = [sys.executable, "-m", "pytest", "test_here.py", "--mla-fuse-impl=adapters_here:OnlyRope", "-n", "1",
               "-p", "no:cacheprovider", "-q", "--hypothesis-profile=mla_fuse.ci"]
    (user_dir / "test_here.py").write_text("from mla_fuse_conformance.properties.test_rotary_embedding import "
                                           "test_rotary_embedding_matches_reference  # noqa: F401\n")
    env = dict(os.environ, MLA_FUSE_REPORT_DIR=str(reports), PYTHONPATH=str(user_dir), DIE_AFTER="3")
    result = subprocess.run(command, capture_output=True, text=True, cwd=user_dir, env=env, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:]
    lines = [json.loads(line) for line in (reports / "outcomes.jsonl").read_text().splitlines()]
    failures = [line["failure"] for line in lines if line.get("failure")]
    assert [f["kind"] for f in failures] == ["crashed after it finished"], lines
    assert failures[0]["property"] == ROPE_PROPERTY and failures[0]["operations"] == ["rotary_embedding"]
    assert sorted(path.name for path in (user_dir / "failures").iterdir()) == [pathlib.Path(failures[0]["file"]).name]

    reports.joinpath("outcomes.jsonl").unlink()
    shutil.rmtree(user_dir / "failures")
    env.pop("DIE_AFTER")
    result = subprocess.run(command, capture_output=True, text=True, cwd=user_dir, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    assert not (user_dir / "failures").exists() or not list((user_dir / "failures").iterdir())


def test_a_limit_is_handled_only_by_cases_that_reach_it():
    """Issue 31, item 6: an fp8 write into a float8 cache declared unsupported was reported "handled (5
    examples passed)" by cases that never wrote an entry (every slot padded): they pass whatever the
    kernel does. Such cases leave the limit "not reached"; one case that writes makes it "handled"."""
    import dataclasses

    from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec

    padded = MlaCase(seed=1, tokens=2, heads=2, latent=3, rotary_dim=4, dtype="float16", kv_cache_dtype="fp8_e4m3",
                     num_blocks=2, block_size=2, slots=SlotSpec(length=2, padding="all"),
                     table=TableSpec(style="plain", rotary_dim=4, max_position=8), cache_storage="float8")
    written = dataclasses.replace(padded, slots=SlotSpec(length=2))

    never_writes = check_limit(_Drawing([padded]), _NoLimits(), lambda case: None, "concat_and_cache_mla",
                               "fp8 storage", "float8")
    assert never_writes.outcome == "not reached" and "none of them wrote" in never_writes.detail, never_writes
    writes = check_limit(_Drawing([padded, written]), _NoLimits(), lambda case: None, "concat_and_cache_mla",
                         "fp8 storage", "float8")
    assert writes.outcome == "handled" and writes.examples >= 1, writes


def test_a_limit_check_leaves_out_the_cases_inside_the_maps_cells(tmp_path, monkeypatch):
    """SGLang's limit check ran a case with per-head scales whose slot mapping was short: it crashed by the
    short-slot defect (a map cell), and the per-head limit read as unguarded. A case inside a failing cell the
    run's map derived for the operation is now left out unrun and counted; a cell of another operation is not
    applied; with every case inside, the limit is not reached (not judged), never handled."""
    import dataclasses

    from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec

    monkeypatch.chdir(tmp_path)
    other = MlaCase(seed=1, tokens=2, heads=2, latent=3, rotary_dim=4, dtype="float16", kv_cache_dtype="auto",
                    num_blocks=2, block_size=2, slots=SlotSpec(length=2), table=TableSpec("plain", 4, 8))
    defect = dataclasses.replace(other, dtype="bfloat16", kv_cache_dtype="auto")
    ran = []

    def run(case):
        ran.append(case)
        assert case.dtype != "bfloat16", "the map's defect"

    cell = {"id": "bf16-cell", "property": "p", "operations": ["concat_and_cache_mla"], "found_by": "p",
            "condition": {"text": "dtype: bfloat16", "data": None, "features": {"dtype": "bfloat16"}}}
    check = lambda cases, cells: check_limit(_Drawing(cases), _NoLimits(), run, "concat_and_cache_mla",  # noqa: E731
                                             "kv_cache_dtype", "auto", cells=cells)
    assert check([defect], []).outcome == "unguarded: wrong result"
    ran.clear()
    handled = check([defect, other], [cell])
    assert handled.outcome == "handled" and "inside the map's failing cells left out (bf16-cell)" in handled.detail
    assert defect not in ran and other in ran, handled
    assert check([defect], [cell]).outcome == "not reached"
    assert check([defect], [dict(cell, operations=["rotary_embedding"])]).outcome == "unguarded: wrong result"


def test_per_head_scales_are_reached_only_with_more_than_one_key_head(tmp_path, monkeypatch):
    """SGLang's fused write reads the first scale only (``tl.load(k_scale_ptr)``): its per-head limit read as
    "handled" from five cases that did not reach it: of one key head (a scale per head is one scale) or of a
    cache without fp8 (no scale applies, the axis has no value). A case of one head passes without reaching the
    limit: another is drawn, and a kernel that passes only those leaves the limit not reached; a case where
    the axis does not apply is never run."""
    import dataclasses

    from mla_fuse_conformance.cases.types import FlashCase, ScaleSpec, SlotSpec, TableSpec

    monkeypatch.chdir(tmp_path)
    per_head = ScaleSpec(mantissa=1.5, per_head=True)
    one_head = FlashCase(seed=6, tokens=4, heads=2, kv_heads=1, head_size=8, value_head_size=8, dtype="bfloat16",
                         kv_cache_dtype="fp8_e4m3", num_blocks=2, block_size=4, slots=SlotSpec(length=4),
                         table=TableSpec("plain", 8, 16), cache_storage="uint8", k_scale=per_head, v_scale=per_head)
    two_heads = dataclasses.replace(one_head, heads=4, kv_heads=2)

    def first_scale_only(case):
        assert case.kv_heads == 1, "head 1 quantized with head 0's scale"

    check = lambda cases: check_limit(_Drawing(cases, "rope_and_reshape_and_cache_flash"), _NoLimits(),  # noqa: E731
                                      first_scale_only, "rope_and_reshape_and_cache_flash", "per-head scales", "yes")
    not_reached = check([one_head])
    assert not_reached.outcome == "not reached" and "more than one key head" in not_reached.detail, not_reached
    assert check([one_head, two_heads]).outcome == "unguarded: wrong result"
    no_fp8 = dataclasses.replace(two_heads, kv_cache_dtype="auto", cache_storage="source")
    assert check([no_fp8]).outcome == "not reached"


class _NoLimits:
    """An implementation whose every case is inside (``check_limit``'s strategy is the property's own)."""

    guarded_by_caller: dict = {}
    spec = "reference"

    def caps(self, operation):
        return self

    def only(self, axis, value):
        return self


class _Drawing:
    """A property drawing from ``cases``."""

    rotates = False
    name = "test_mla:test_mla_cache_write_matches_reference"

    def __init__(self, cases, operation="concat_and_cache_mla"):
        self.cases, self.operations = cases, (operation,)

    def strategy_for(self, impl, capabilities):
        from hypothesis import strategies as st

        return st.sampled_from(self.cases)


def test_an_unguarded_declared_limit_fails_the_verdict_whose_properties_pass(user_dir):
    """The properties draw inside the declarations and pass; the limit check finds that int32 positions, declared
    unsupported, give a silent wrong result: the verdict fails, with the limit's id in ``failing``."""
    env = dict(os.environ, PYTHONPATH=str(user_dir))
    env.pop("CI", None)
    done = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", "adapters_here:IgnoresInt32",
                           "-n", "1", "--map-rounds", "1", "--", "-k", "test_rotary_embedding_matches_reference"],
                          cwd=user_dir, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads((user_dir / ".mla_fuse_reports" / "report.json").read_text())
    assert report["operations"]["rotary_embedding"]["verdict"] == "pass", done.stdout[-3000:]
    assert done.returncode == 1 and report["verdict"] == "FAIL", done.stdout[-3000:]
    assert "limit | rotary_embedding: positions dtype int32 | unguarded: wrong result" in report["failing"]
    assert "positions dtype int32: unguarded: wrong result" in done.stdout and "replay: " in done.stdout


def test_repro_reproduces_only_the_recorded_kind_of_failure(user_dir, capsys):
    """A wrong result replayed against a kernel that now raises is not "REPRODUCED": another failure confirms
    nothing (exit 3, naming both kinds)."""
    impl = load_implementation("adapters_here:SecondHeadsWrong")
    prop = property_named(ROPE_PROPERTY)
    found = map_property(prop, impl, "cpu", _in_process(prop, impl), max_examples=40, rounds=1)
    record = repro.load(found.cells[0].file)
    assert record["kind"] == "wrong result"
    assert repro.replay(record) == repro.REPRODUCED
    assert repro.replay(record, impl_spec="adapters_here:RaisesOnRank3") == repro.OTHER_FAILURE
    assert "did not reproduce: recorded wrong result, this run raised RuntimeError" in capsys.readouterr().out


@pytest.mark.parametrize("recorded, now, same", [
    ("wrong result", "wrong result", True), ("wrong result", "raised RuntimeError", False),
    ("raised RuntimeError", "raised RuntimeError", True), ("raised RuntimeError", "raised ValueError", False),
    ("crashed (SIGSEGV)", "crashed (SIGSEGV)", True), ("crashed (SIGSEGV)", "crashed (SIGABRT)", False),
    ("crashed", "crashed (SIGBUS)", True), ("crashed after it finished", "crashed (SIGSEGV)", True),
    ("hung", "hung: no result in 120 s", True), ("hung", "wrong result", False),
    ("wrong result, not the same on replay", "wrong result", True),
    ("did not reproduce: wrong result once, passed when hypothesis ran it again", "raised TypeError", True),
])
def test_what_counts_as_the_recorded_failure(recorded, now, same):
    assert repro.same_failure(recorded, now) is same


def test_an_assert_of_the_implementation_is_what_it_raised_not_a_wrong_result(user_dir):
    impl = load_implementation("adapters_here:AssertsOnRank2")
    prop = property_named(ROPE_PROPERTY)
    with pytest.raises(Exception) as raised:
        _in_process(prop, impl)(RANK2)
    assert recording.failure_kind(raised.value) == "raised AssertionError", raised.value
    with Executor(impl.spec, "cpu") as executor, pytest.raises(RaisedInChild) as in_child:
        executor.run(prop.name, RANK2)
    assert recording.failure_kind(in_child.value) == "raised AssertionError"
    assert "query should be rank 3" in str(in_child.value)
