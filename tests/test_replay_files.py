"""Failure files written by one hypothesis version replay under any supported one.

The files under ``tests/data/replay/`` were written by the suite (their ``hypothesis_version``
says by which hypothesis); ``mla-fuse repro`` rebuilds the case from the file, without hypothesis,
so CI's oldest-hypothesis leg replays them as the newest does.

A compile-pass record carries the planted pass bug it was found with (``pass_mutant``), which
``repro`` plants again; the same record without it replays the correct passes, which must pass.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

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
