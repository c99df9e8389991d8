"""Failure files written by one hypothesis version replay under any supported one.

The files under ``tests/data/replay/`` were written by the suite (their ``hypothesis_version``
says by which hypothesis); ``mla-fuse repro`` rebuilds the case from the file, without hypothesis,
so CI's oldest-hypothesis leg replays them as the newest does.

A failure of a team's adapter records the directory the adapter was imported from, so the file
replays from any directory (the team's first hour: the replay line worked only from the run's).

A compile-pass record carries the planted pass bug it was found with (``pass_mutant``), which
``repro`` plants again; the same record without it replays the correct passes, which must pass.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from mla_fuse_conformance.running import recording

FILES = sorted((pathlib.Path(__file__).parent / "data" / "replay").glob("*.json"))
KERNEL_FILES = [path for path in FILES if "pass_mutant" not in json.loads(path.read_text())]
PASS_FILES = [path for path in FILES if "pass_mutant" in json.loads(path.read_text())]


def repro(path: pathlib.Path, cwd: pathlib.Path, *options: str) -> subprocess.CompletedProcess:
    """``python -m mla_fuse_conformance repro FILE``, as a user replays a failure file."""
    return subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "repro", str(path), *options],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.mark.parametrize("path", KERNEL_FILES, ids=[path.stem for path in KERNEL_FILES])
def test_a_saved_failure_replays_and_a_correct_implementation_passes_it(path, tmp_path):
    reproduced = repro(path, tmp_path)
    assert reproduced.returncode == 1 and "REPRODUCED" in reproduced.stdout, reproduced.stdout + reproduced.stderr
    passed = repro(path, tmp_path, "--impl", json.loads(path.read_text()).get("correct_impl", "reference"))
    assert passed.returncode == 0, passed.stdout + passed.stderr


@pytest.mark.parametrize("path", PASS_FILES, ids=[path.stem for path in PASS_FILES])
def test_a_compile_pass_record_replays_its_planted_bug(path, tmp_path):
    reproduced = repro(path, tmp_path)
    planted = json.loads(path.read_text())["pass_mutant"]
    assert f"pass mutant planted: {planted}" in reproduced.stdout, reproduced.stdout + reproduced.stderr
    assert reproduced.returncode == 1 and "REPRODUCED" in reproduced.stdout, reproduced.stdout + reproduced.stderr


@pytest.mark.parametrize("path", PASS_FILES, ids=[path.stem for path in PASS_FILES])
def test_a_compile_pass_record_without_its_planted_bug_passes(path, tmp_path):
    record = json.loads(path.read_text())
    del record["pass_mutant"]
    correct = tmp_path / path.name
    correct.write_text(json.dumps(record))
    passed = repro(correct, tmp_path)
    assert passed.returncode == 0 and "pass mutant planted" not in passed.stdout, passed.stdout + passed.stderr


OUTSIDE_ADAPTER = """
from mla_fuse_reference.adapter import ReferenceImplementation


class Outside(ReferenceImplementation):
    name = "a team's adapter, in the team's directory"
"""


def test_a_failure_file_of_an_outside_adapter_replays_from_another_directory(tmp_path, monkeypatch, no_kernel_paths):
    """A team's adapter imported from its own directory: the file records that directory and the
    printed line carries it in ``PYTHONPATH`` with the file's absolute path, so both replay from
    elsewhere (before, only from the run's directory); a file without it says what to do."""
    team, elsewhere = tmp_path / "team", tmp_path / "elsewhere"
    team.mkdir(), elsewhere.mkdir()
    (team / "team_outside_adapter.py").write_text(OUTSIDE_ADAPTER)
    monkeypatch.syspath_prepend(str(team))
    monkeypatch.chdir(team)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv(recording.FAILURE_DIR_ENV, ".mla_fuse_failures")  # relative to the run's directory
    __import__("team_outside_adapter")
    failure = {key: value for key, value in json.loads(KERNEL_FILES[0].read_text()).items()
               if key not in ("replay", "pytest", "nodeid", "profile", "hypothesis_version", "correct_impl")}
    saved = recording.save_failure(dict(failure, impl="team_outside_adapter:Outside"), "test_x.py::test_x",
                                   "mla_fuse.ci")
    record = json.loads(saved.read_text())
    assert record["pythonpath"] == [str(team)] and saved.is_absolute()
    assert record["replay"] == f"PYTHONPATH={team} {recording.python_command()} -m mla_fuse_conformance repro {saved}"
    printed = subprocess.run(["bash", "-c", record["replay"]], capture_output=True, text=True, cwd=elsewhere,
                             timeout=600)
    assert printed.returncode == 0 and "PASSED" in printed.stdout, printed.stdout + printed.stderr
    by_file = repro(saved, elsewhere)  # `mla-fuse repro FILE`, nothing else told
    assert by_file.returncode == 0 and "PASSED" in by_file.stdout, by_file.stdout + by_file.stderr
    del record["pythonpath"]
    (elsewhere / "old.json").write_text(json.dumps(record))
    lost = repro(elsewhere / "old.json", elsewhere)
    assert lost.returncode == 2 and "run this from the adapter's directory" in lost.stderr, lost.stdout + lost.stderr
