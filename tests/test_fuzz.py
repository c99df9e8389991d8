"""``mla-fuse fuzz`` and ``mla-fuse db`` without running a campaign (docs/FUZZING.md).

The database a string names, read-only runners, one key per property shared with HypoFuzz,
export/import, what the campaign's summary makes of HypoFuzz's reports, and bad arguments.
The campaign itself runs in tests/test_fuzz_redis.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import warnings
import zipfile

import pytest
from hypothesis import Phase, settings
from hypothesis.database import (DirectoryBasedExampleDatabase, InMemoryExampleDatabase, MultiplexedDatabase,
                                 ReadOnlyDatabase)
from hypothesis.extra.redis import RedisExampleDatabase
from hypothesis.internal.conjecture.data import Status
from hypothesis.internal.reflection import function_digest

import mla_fuse_conformance.properties.test_flash as flash_properties
import mla_fuse_conformance.properties.test_mla as mla_properties
from mla_fuse_conformance.commands import cli
from mla_fuse_conformance.settings import database
from mla_fuse_conformance.commands.fuzz import cli as fuzz
from mla_fuse_conformance.commands.fuzz import report as fuzz_report
from mla_fuse_conformance.commands.fuzz import workers as fuzz_workers
from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.running import recording

NODEID = "test_flash.py::test_fused_flash_matches_reference"


# ---------------------------------------------------------------- which database


def test_a_string_names_a_directory_or_a_redis_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert database.open_shared(None) == DirectoryBasedExampleDatabase(tmp_path / ".hypothesis" / "mla_fuse")
    assert database.open_shared("shared") == DirectoryBasedExampleDatabase(tmp_path / "shared")
    redis = database.open_shared("redis://:secret@127.0.0.1:6390/2")  # nothing connects until used
    assert isinstance(redis, RedisExampleDatabase)
    assert redis.redis.connection_pool.connection_kwargs["db"] == 2
    assert database.shown("redis://:secret@127.0.0.1:6390/2") == "redis://:***@127.0.0.1:6390/2"


@pytest.mark.parametrize("url, complaint", [("http://example.invalid/db", "neither a directory nor"),
                                            ("redis://127.0.0.1:notaport/0", "not a valid Redis URL")])
def test_a_bad_database_string_is_an_error_naming_its_source(url, complaint):
    with pytest.raises(ValueError, match=complaint) as error:
        database.open_shared(url, "--db")
    assert str(error.value).startswith("--db: ")


def test_a_read_only_runner_reads_the_shared_database_and_writes_only_locally(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shared = DirectoryBasedExampleDatabase(tmp_path / "shared")
    shared.save(b"key", b"found by another runner")
    runner = database.open_database(str(tmp_path / "shared"), read_only=True)
    assert isinstance(runner.wrapped, MultiplexedDatabase)
    runner.save(b"key", b"found here")
    assert set(runner.fetch(b"key")) == {b"found by another runner", b"found here"}
    assert set(shared.fetch(b"key")) == {b"found by another runner"}
    assert set(DirectoryBasedExampleDatabase(tmp_path / ".hypothesis" / "mla_fuse").fetch(b"key")) == {b"found here"}
    assert isinstance(database.open_database(None, read_only=True).wrapped, ReadOnlyDatabase)


def test_the_replay_profile_only_replays_the_database():
    replay = settings.get_profile("mla_fuse.replay")
    assert tuple(replay.phases) == (Phase.reuse,) and replay.database is not None


def test_under_ci_only_the_ci_profile_is_derandomized():
    """Hypothesis loads its own `ci` profile at import when CI is set; ours must not inherit it
    (HypoFuzz refuses derandomized tests, and dev/gpu/nightly are random by design)."""
    check = ("import json; from hypothesis import settings; import mla_fuse_conformance.settings.profiles as p; "
             "print(json.dumps({n: settings.get_profile(p.full_name(n)).derandomize for n in p.NAMES}))")
    shown = subprocess.run([sys.executable, "-c", check], env={**os.environ, "CI": "true"}, capture_output=True,
                           text=True, check=True).stdout
    assert json.loads(shown) == {name: name == "ci" for name in profiles.NAMES}


# ---------------------------------------------------------------- one key per property


class Item:
    """What key_by_suite_node_id reads of a pytest item."""

    def __init__(self, test, path, nodeid):
        self.obj, self.path, self.nodeid = test, path, nodeid


def key_of(test, path, nodeid) -> bytes:
    database.key_by_suite_node_id(Item(test, path, nodeid))
    return function_digest(test.hypothesis.inner_test)


def test_every_property_gets_its_own_key_whatever_directory_pytest_started_in(tmp_path):
    fused, cache_write = mla_properties.test_fused_mla_matches_reference, mla_properties.test_mla_cache_write_matches_reference
    # each property is its own @given function; the node id makes the key independent of the directory
    from_clone = key_of(fused, tmp_path / "property_tests" / "test_mla.py",
                        "property_tests/test_mla.py::test_fused_mla_matches_reference")
    installed = key_of(fused, tmp_path / "site-packages" / "mla_fuse_conformance" / "test_mla.py",
                       "../site-packages/mla_fuse_conformance/test_mla.py::test_fused_mla_matches_reference")
    other = key_of(cache_write, tmp_path / "test_mla.py", "test_mla.py::test_mla_cache_write_matches_reference")
    assert from_clone == installed != other


def test_the_suite_node_id_is_what_hypofuzz_sees_from_the_suite_directory(tmp_path):
    item = Item(flash_properties.test_fused_flash_matches_reference, tmp_path / "property_tests" / "test_flash.py",
                "property_tests/test_flash.py::test_fused_flash_matches_reference")
    assert database.suite_node_id(item) == NODEID
    assert f"--rootdir={fuzz.SUITE_DIR}" in fuzz.worker_command("mutant:none", [])


# ---------------------------------------------------------------- export and import


def test_an_export_holds_every_entry_and_imports_into_another_database(tmp_path):
    source = DirectoryBasedExampleDatabase(tmp_path / "source")
    entries = {b"key one": {b"a", b"b"}, b"key two.secondary": {b"c"}}
    for key, values in entries.items():
        for value in values:
            source.save(key, value)
    exported = database.export_database(source, tmp_path / "db.zip")
    assert (exported.keys, exported.values) == (2, 3)
    assert database.read_manifest(tmp_path / "db.zip")["values"] == 3
    target = DirectoryBasedExampleDatabase(tmp_path / "target")
    target.save(b"key one", b"already there")
    imported = database.import_database(tmp_path / "db.zip", target)
    assert (imported.keys, imported.values) == (2, 3)
    assert set(target.fetch(b"key one")) == {b"a", b"b", b"already there"}
    assert set(target.fetch(b"key two.secondary")) == {b"c"}


def test_importing_a_file_that_is_not_an_export_names_it_and_writes_nothing(tmp_path, capsys):
    not_an_export = tmp_path / "notes.zip"
    with zipfile.ZipFile(not_an_export, "w") as archive:
        archive.writestr("readme.txt", "hello")
    target = tmp_path / "target"
    assert cli.main(["db", "import", str(not_an_export), "--db", str(target)]) == 2
    assert f"{not_an_export}: not an mla-fuse database export" in capsys.readouterr().out
    assert not target.exists()
    assert cli.main(["db", "import", str(tmp_path / "missing.zip"), "--db", str(target)]) == 2


# ---------------------------------------------------------------- the campaign's summary


def report(worker, inputs, failed, phase="generate", elapsed=1.0, timestamp=100.0):
    from hypofuzz.database import Phase as FuzzPhase
    from hypofuzz.database.models import Report, StatusCounts

    counts = StatusCounts({Status.OVERRUN: 0, Status.INVALID: 0, Status.VALID: inputs - failed,
                           Status.INTERESTING: failed})
    return Report(database_key="a2V5", nodeid=NODEID, elapsed_time=elapsed, timestamp=timestamp, worker_uuid=worker,
                  status_counts=counts, behaviors=10 * inputs, fingerprints=inputs, since_new_behavior=None,
                  phase=FuzzPhase(phase))


def identity(uuid, pid, host="runner-1"):
    from hypofuzz.database.models import WorkerIdentity

    return WorkerIdentity(uuid=uuid, operating_system="Linux", python_version="3.11", hypothesis_version="",
                          hypofuzz_version="", pid=pid, hostname=host, pod_name=None, pod_namespace=None,
                          node_name=None, pod_ip=None, container_id=None, git_hash=None)


def failure(reason, traceback):
    from hypofuzz.database.models import Observation, ObservationMetadata, ObservationStatus

    metadata = ObservationMetadata(traceback=traceback, reproduction_decorator=None, predicates={}, backend={},
                                   sys_argv=[], os_getpid=1, imported_at=0.0, data_status=Status.INTERESTING)
    return Observation(type="test_case", status=ObservationStatus.FAILED, status_reason=reason, representation="",
                       arguments={}, how_generated="", features={}, timing={}, metadata=metadata, property=NODEID,
                       run_start=0.0, stability=None)


def campaign_database(stored_failure):
    """One property fuzzed by workers a (pid 11) and b (pid 12) of this campaign, c of another host
    and d of an earlier run; a found the failure after 7 inputs, b replayed it first."""
    from hypofuzz.database import FailureState, HypofuzzDatabase
    from hypofuzz.database.database import test_keys_key

    db = InMemoryExampleDatabase()
    fuzz_db, key = HypofuzzDatabase(db), b"k" * 48
    fuzz_db.save(test_keys_key, key)
    for worker, pid, host in (("a", 11, "runner-1"), ("b", 12, "runner-1"), ("c", 11, "runner-2"), ("d", 13, "runner-1")):
        fuzz_db.worker_identities.save(identity(worker, pid, host))
    for entry in (report("a", 5, 0, elapsed=1), report("a", 7, 1, elapsed=2), report("a", 7, 1, "failed", elapsed=3),
                  report("b", 1, 1, elapsed=1), report("b", 1, 1, "failed", elapsed=2), report("c", 50, 0),
                  report("d", 80, 1, timestamp=10.0)):
        fuzz_db.reports.save(key, entry)
    fuzz_db.failures(state=FailureState.SHRUNK).save(key, (1, 2), stored_failure)
    return db


def test_the_summary_counts_this_campaigns_workers_and_when_each_first_failed():
    traceback = "    def check():\nE   AssertionError: cache differs\nE     - fp8 codes wrong\nE     - more"
    window = fuzz.CampaignWindow(started=50.0, finished=200.0, host="runner-1", pids=frozenset({11, 12}))
    summary = fuzz.read_campaign(campaign_database(failure("AssertionError at x.py:1", traceback)), window)[NODEID]
    assert (summary.inputs, summary.behaviors, summary.fingerprints) == (8, 70, 7)
    assert sorted(summary.first_failure_at) == [1, 7] and summary.shrunk
    assert summary.failures == ["AssertionError: cache differs - fp8 codes wrong"]
    assert summary.verdict == "did not replay"  # until the replay pass reproduces it
    summary.replay = "failed"
    assert summary.verdict == "FAIL"


def test_the_progress_line_gives_each_workers_inputs_and_failed_properties_so_far():
    window = fuzz.CampaignWindow(started=50.0, finished=200.0, host="runner-1", pids=frozenset({11, 12}))
    counts = fuzz_workers.worker_counts(campaign_database(failure("x", "")), window, [{11}, {12}, {99}])
    assert counts == [(7, 1), (1, 1), (0, 0)]
    assert fuzz_workers.campaign_line(counts, 95) == ("fuzzing 1:35: worker 0: 7 inputs, 1 property failed; worker 1: "
                                                      "1 inputs, 1 property failed; worker 2: 0 inputs, 0 properties failed")


def test_a_skip_hypofuzz_stores_as_a_failure_is_reported_as_a_skip():
    window = fuzz.CampaignWindow(started=50.0, finished=200.0, host="runner-1", pids=frozenset({11, 12}))
    skip = failure("Skipped at harness.py:120", "E   Skipped: mutant:x does not provide rotary_embedding")
    summary = fuzz.read_campaign(campaign_database(skip), window)[NODEID]
    assert summary.failures == [] and summary.first_failure_at == [] and summary.verdict == "skipped"


# ---------------------------------------------------------------- workers and arguments


def test_the_compile_pass_properties_run_only_for_the_implementation_the_passes_call():
    assert any(path.endswith("test_compile_passes.py") for path in fuzz.suite_files("triton"))
    assert not any(path.endswith("test_compile_passes.py") for path in fuzz.suite_files("mutant:none"))


def test_worker_i_runs_on_gpu_i_unless_the_device_is_chosen(monkeypatch):
    monkeypatch.delenv("MLA_FUSE_DEVICE", raising=False)
    assert fuzz.worker_devices(3, ["cuda:0", "cuda:1"]) == ["cuda:0", "cuda:1", "cuda:0"]
    assert fuzz.worker_devices(2, []) == [None, None]
    monkeypatch.setenv("MLA_FUSE_DEVICE", "cuda:3")
    assert fuzz.worker_devices(2, ["cuda:0", "cuda:1"]) == [None, None]


@pytest.mark.parametrize("arguments, complaint", [
    (["--minutes", "0"], "--minutes must be positive"),
    (["--workers", "0"], "--workers must be at least 1"),
    (["--read-only"], "--read-only needs --db"),
    (["--impl", "no_such_module_anywhere:Kernels"], "--impl 'no_such_module_anywhere:Kernels'"),
    (["--db", "ftp://example.invalid/"], "--db: 'ftp://example.invalid/' is neither a directory"),
])
def test_bad_arguments_are_refused_before_any_worker_starts(arguments, complaint, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(database.DATABASE_ENV_VAR, raising=False)
    out = tmp_path / "out"
    assert cli.main(["fuzz", "--impl", "mutant:none", "--out", str(out), *arguments]) == 2
    assert complaint in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.parametrize("package", ["hypofuzz", "psutil"])
def test_without_the_fuzz_extra_the_command_names_the_package_and_how_to_install_it(package, tmp_path, capsys,
                                                                                     monkeypatch):
    """Without the ``fuzz`` extra, ``mla-fuse fuzz`` crashed on the import; now one line and status 2."""
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError, as when not installed
    out = tmp_path / "out"
    assert cli.main(["fuzz", "--impl", "mutant:none", "--out", str(out)]) == fuzz.EXIT_BAD_ARGUMENTS == 2
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and f"{package!r}" in printed[0], printed
    assert printed[0].endswith('pip install "mla_fuse[fuzz]"')
    assert not out.exists()


def test_python_m_fuzz_without_hypofuzz_exits_2_with_one_line(tmp_path):
    """The same through ``python -m mla_fuse_conformance fuzz``, in a process where hypofuzz is absent
    (HYPOTHESIS_NO_PLUGINS: hypothesis does not load hypofuzz's entry point, as where it is not installed)."""
    script = ("import runpy, sys; sys.modules['hypofuzz'] = None; sys.argv = ['mla_fuse_conformance', 'fuzz']; "
              "runpy.run_module('mla_fuse_conformance', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HYPOTHESIS_NO_PLUGINS": "1"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["mla-fuse fuzz: needs 'hypofuzz', which is not installed (the fuzz extra): "
                                        'pip install "mla_fuse[fuzz]"'] and "Traceback" not in done.stderr


def test_the_summary_file_says_what_failed(tmp_path, capsys):
    class Options:
        spec, db, read_only, minutes = "mutant:x", None, False, 1.0

    summary = fuzz.PropertySummary(NODEID, "6b", inputs=7, first_failure_at=[7], failures=["AssertionError: boom"],
                                   replay="failed", replay_files=[str(tmp_path / "case.json")])
    assert fuzz.write_report(Options, [], {NODEID: summary}, [], 60.0, tmp_path) == fuzz.EXIT_FAILED == 1
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["passed"] is False and written["properties"][NODEID]["verdict"] == "FAIL"
    printed = capsys.readouterr().out
    assert re.search(r"replay exactly: \S+ -m mla_fuse_conformance repro", printed) and "verdict: FAIL (exit status 1)" in printed


def test_the_summarys_pytest_line_runs_from_any_directory(tmp_path, monkeypatch):
    """The line once began with a bare ``python`` (not the venv's in the team's shell: "unrecognized
    arguments: --mla-fuse-impl") and named the database and the adapter relative to the run's directory."""
    team = tmp_path / "team"
    team.mkdir()
    (team / "team_adapter_for_the_summary.py").write_text("class Kernels:\n    pass\n")
    monkeypatch.syspath_prepend(str(team))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(team)
    __import__("team_adapter_for_the_summary")

    class Options:
        spec, db = "team_adapter_for_the_summary:Kernels", "db"

    line = fuzz_report.pytest_replay_command(NODEID, Options)
    assert line.startswith(f"{database.DATABASE_ENV_VAR}={team / 'db'} PYTHONPATH={team} "
                           f"{recording.python_command()} -m pytest --pyargs mla_fuse_conformance "), line


def test_a_stopped_worker_ends_quietly(tmp_path):
    """Workers were stopped with SIGINT: every passing campaign's log ended in a KeyboardInterrupt
    traceback. A worker ends on ``STOP_SIGNAL`` at once, status 0, with one line."""
    log = tmp_path / "worker-0.log"
    waiting = ("import signal, time\nfrom mla_fuse_conformance.commands.fuzz import worker as fuzz_worker\n"
               "signal.signal(fuzz_worker.STOP_SIGNAL, fuzz_worker.stop_now)\nprint('ready', flush=True)\n"
               "time.sleep(60)\n")
    with open(log, "w") as stream:
        process = subprocess.Popen([sys.executable, "-c", waiting], stdout=stream, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    worker = fuzz.Worker(0, None, log, process)
    deadline = time.monotonic() + 60
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    fuzz.stop([worker])
    assert worker.stopped and not worker.died() and process.returncode == 0
    assert log.read_text() == "ready\nstopped by mla-fuse fuzz\n"


def test_the_version_stamped_database_passes_on_change_events_without_a_warning():
    """HypoFuzz listens for another worker's corpus entries; hypothesis warned "does not support
    listening for changes" at every worker's start and nothing was heard."""
    heard = []
    stamped = database.VersionStampedDatabase(InMemoryExampleDatabase())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stamped.add_listener(heard.append)
        stamped.save(b"key", b"value")
        stamped.remove_listener(heard.append)
    stamped.save(b"key", b"other")
    assert heard == [("save", (b"key", b"value"))]  # not the version stamp saved beside it


def test_a_failure_that_does_not_replay_is_reported_with_both_outcomes_never_as_fail(tmp_path, capsys):
    class Options:
        spec, db, read_only, minutes = "reference", None, False, 1.0

    summary = fuzz.PropertySummary(NODEID, "6b", inputs=163, first_failure_at=[163],
                                   failures=["FileNotFoundError: inflight-main.json"], replay="passed")
    assert summary.verdict == "did not replay"
    status = fuzz.write_report(Options, [], {NODEID: summary}, [], 60.0, tmp_path)
    assert status == fuzz.EXIT_DID_NOT_REPLAY == 4
    printed = capsys.readouterr().out
    assert f"DID NOT REPLAY {NODEID}" in printed and "in the campaign: failed (first failure at input 163): " \
        "FileNotFoundError" in printed and "on replay: passed" in printed
    assert "verdict: FAIL" not in printed and "FAILED" not in printed
    # a campaign that could not run says so, with another status than a failure's
    assert fuzz.write_report(Options, [], {NODEID: summary}, ["worker 1 did not fuzz until the end"], 60.0,
                             tmp_path) == fuzz.EXIT_COULD_NOT_RUN == 3
    assert "verdict: COULD NOT RUN (exit status 3)" in capsys.readouterr().out


def test_a_failure_without_pytest_lines_still_says_what_failed():
    plain = failure("", "Traceback (most recent call last):\n  File \"x.py\", line 1\nFileNotFoundError: [Errno 2] x")
    assert fuzz.failure_message(plain) == "FileNotFoundError: [Errno 2] x"
    assert fuzz.failure_message(failure("", "")) != ""


# ---------------------------------------------------------------- workers that stop fuzzing


REENTER = """
from hypofuzz.collection import collect_tests
from mla_fuse_conformance.commands.fuzz import cli as fuzz

args = [*fuzz.suite_files("reference"), *fuzz.pytest_options("reference", "nightly"), "-k", "cache_write_matches"]
targets = collect_tests(args).fuzz_targets
assert len(targets) == 2, [t.nodeid for t in targets]
current = None
for target in (*targets, *targets):  # A, B, A, B: as HypoFuzz moves between properties in one process
    if current is not None:
        current._exit_fixtures()
    target._enter_fixtures()
    target.run_one()
    current = target
print("entered every property twice")
"""


def test_hypofuzz_can_enter_a_property_again_after_leaving_it(tmp_path):
    """HypoFuzz tears every fixture down when it leaves a property and sets them up when it comes
    back; pytest's cached fixture definitions made the second entry fail ("The fixture value for
    "mla_fuse_impl" is not available"), which killed campaign workers (running/reentry.py)."""
    env = {**os.environ, database.DATABASE_ENV_VAR: str(tmp_path / "db"), "MLA_FUSE_FAILURE_DIR": str(tmp_path / "f")}
    done = subprocess.run([sys.executable, "-c", REENTER], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert "entered every property twice" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


DYING_WORKER = """
import time
time.sleep(0.5)
raise AssertionError('The fixture value for "mla_fuse_impl" is not available.')
"""


def test_a_worker_that_dies_is_reported_with_its_log_and_the_campaign_could_not_run(tmp_path):
    log = tmp_path / "worker-0.log"
    with open(log, "w") as stream:
        process = subprocess.Popen([sys.executable, "-c", DYING_WORKER], stdout=stream, stderr=subprocess.STDOUT)
    worker = fuzz.Worker(0, None, log, process)
    process.wait(timeout=60)
    assert worker.died()
    errors = fuzz.campaign_errors([worker], {NODEID: fuzz.PropertySummary(NODEID, "6b", inputs=3)})
    assert len(errors) == 1 and "worker 0 did not fuzz until the end: it died (exit status 1)" in errors[0]
    assert str(log) in errors[0] and "The fixture value for" in errors[0]  # the end of its log
    assert fuzz.exit_status({}, errors) == fuzz.EXIT_COULD_NOT_RUN
    stopped = fuzz.Worker(1, None, log, process, stopped=True)  # ended by mla-fuse fuzz: not a death
    assert not stopped.died()


def test_a_worker_is_hypofuzzs_loop_without_the_hub_that_ended_slow_campaigns():
    """HypoFuzz 25.11.1's hub decides every 60 s that "every test has failed" when no fuzzing process
    has yet reported a property left to fuzz, which it does only after 100 inputs: with slow
    properties it ended campaigns after a minute and killed the fuzzing processes."""
    from mla_fuse_conformance.commands.fuzz import worker as fuzz_worker

    command = fuzz.worker_command("triton", [])
    assert command[1:3] == ["-m", fuzz.WORKER_MODULE] and "fuzz" not in command[1:4]
    state = fuzz_worker.WorkerState(valid_nodeids=[None])
    state["valid_nodeids"] = ["test_mla.py::test_fused_mla_matches_reference"]  # a report: goes on
    with pytest.raises(SystemExit) as ended:
        state["valid_nodeids"] = []  # every property failed (or was skipped): ends, saying so
    assert ended.value.code == 0


def test_each_worker_and_the_replay_pass_have_their_own_in_flight_file(tmp_path):
    """One shared in-flight file: a worker moved another's away, and the suite's bookkeeping failed
    an example with FileNotFoundError (a failure that then passed on replay)."""
    class Options:
        db, read_only = str(tmp_path / "db"), False

    files = {fuzz.worker_environment(Options, None, False, tmp_path / f"worker-{i}.inflight.json")
             [recording.INFLIGHT_ENV] for i in range(2)}
    assert len(files) == 2
    recorder = recording.Recorder()
    recorder.track_inflight = True
    os.environ[recording.INFLIGHT_ENV] = str(tmp_path / "gone.json")
    try:
        recorder.finished()  # the file is not there (another process moved it): not an error of the example
    finally:
        del os.environ[recording.INFLIGHT_ENV]


# ---------------------------------------------------------------- a correct implementation's campaign

CAMPAIGN_MINUTES = 1.0


def test_a_correct_implementations_two_worker_campaign_passes_and_no_worker_dies(tmp_path):
    """The campaign that ended FAIL (or lost workers) for correct implementations on a loaded 2-core
    machine: a dying worker (fixture re-entry), a hub that ended slow campaigns, two workers sharing
    one in-flight file. One minute, two workers, the reference implementation, its fast properties."""
    out = tmp_path / "out"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLA_FUSE_")}
    done = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "fuzz", "--workers", "2", "--impl",
                           "reference", "--minutes", str(CAMPAIGN_MINUTES), "--db", str(tmp_path / "db"),
                           "--out", str(out), "--", "-k", "cache_write_matches or rotary_embedding_matches"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert done.returncode == fuzz.EXIT_PASSED, done.stdout[-6000:] + done.stderr[-3000:]
    assert summary["verdict"] == "PASS" and summary["errors"] == []
    assert [worker["died"] for worker in summary["workers"]] == [False, False]
    assert all(worker["stopped_by_mla_fuse"] for worker in summary["workers"])
    assert all((out / f"worker-{i}.log").stat().st_size > 0 for i in range(2))
    for log in (out / f"worker-{i}.log" for i in range(2)):  # a passing campaign's logs: no traceback, no warning
        text = log.read_text()
        assert "Traceback" not in text and "Warning" not in text and text.endswith("stopped by mla-fuse fuzz\n"), text
    assert sum(prop["inputs"] for prop in summary["properties"].values()) > 0


FLAKY_PROPERTY = '''
import pytest
from hypothesis import given

from mla_fuse_conformance.cases import strategies

calls = []


def fails_on_its_first_call(run, case):
    calls.append(1)
    assert len(calls) != 1, "first call fails"


@pytest.mark.mla_fuse("rotary_embedding")
@given(case=strategies.rope_cases())
def test_fails_only_on_its_first_call(mla_fuse, case):
    mla_fuse.example(case, fails_on_its_first_call)
'''


def test_a_failure_hypothesis_could_not_reproduce_is_recorded_as_such(tmp_path):
    """pytest: hypothesis' FlakyFailure (failed once, passed when run again) leaves a failure file
    that says so, not a plain 'wrong result'."""
    (tmp_path / "test_flaky_property.py").write_text(FLAKY_PROPERTY)
    env = {**os.environ, recording.FAILURE_DIR_ENV: str(tmp_path / "failures")}
    done = subprocess.run([sys.executable, "-m", "pytest", "test_flaky_property.py", "-q", "-p", "no:cacheprovider",
                           "--mla-fuse-impl=reference", "--hypothesis-profile=mla_fuse.dev"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert "FlakyFailure" in done.stdout, done.stdout[-3000:]
    [record] = [json.loads(path.read_text()) for path in (tmp_path / "failures").glob("*.json")]
    assert record["kind"] == "did not reproduce: wrong result once, passed when hypothesis ran it again"
