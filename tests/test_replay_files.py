"""Failure files written by one hypothesis version replay under any supported one (issue 17, item 2).

The files under ``tests/data/replay/`` were written by the suite (their ``hypothesis_version``
says by which hypothesis); ``mla-fuse repro`` rebuilds the case from the file, without hypothesis,
so CI's oldest-hypothesis leg replays them as the newest does.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

FILES = sorted((pathlib.Path(__file__).parent / "data" / "replay").glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_a_saved_failure_replays_and_a_correct_implementation_passes_it(path, tmp_path):
    record = json.loads(path.read_text())
    command = [sys.executable, "-m", "mla_fuse_conformance", "repro", str(path)]
    reproduced = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert reproduced.returncode == 1 and "REPRODUCED" in reproduced.stdout, reproduced.stdout + reproduced.stderr
    correct = record.get("correct_impl", "reference")
    passed = subprocess.run([*command, "--impl", correct], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert passed.returncode == 0, passed.stdout + passed.stderr
