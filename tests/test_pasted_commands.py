"""The commands a failing property prints run when pasted into a new shell, from another directory.

Issue 31 (item 5): the replay line began with a bare ``python`` (printed on purpose when the venv was
active); in a fresh shell that Python had no suite and exited 1 with ``No module named
mla_fuse_conformance``, the status ``repro`` uses for "reproduced". The pytest line ended in a
parenthesized note on the same line: a bash syntax error (exit 2) when pasted. Every printed command
now starts with the interpreter's absolute path (after the ``PYTHONPATH`` the run needs), names files
by absolute paths, and keeps notes on a line of their own.

The test plants a bug (``mutant:sin_sign_flipped``), lets one property fail in a run directory, takes
the two lines from the "reproduce this failure" block, and runs each with ``bash -c LINE`` in an
empty directory with only ``PATH=/usr/bin:/bin`` and ``HOME`` set (``env -i``: no venv, no
``PYTHONPATH``, nothing of the run's shell).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

from mla_fuse_conformance.running import recording

PROPERTY = "mla_fuse_conformance.properties.test_mla::test_fused_mla_matches_reference"


def fresh_shell(line: str, cwd, home) -> subprocess.CompletedProcess:
    """``env -i PATH=/usr/bin:/bin HOME=HOME bash -c LINE`` in ``cwd``: a line pasted into a new shell."""
    return subprocess.run(["/bin/bash", "-c", line], cwd=cwd, env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
                          capture_output=True, text=True, timeout=300)


def printed(output: str, label: str) -> tuple[str, str]:
    """The command after ``label:`` in the failure block, and the line below it."""
    found = re.search(rf"^{label}: (.+)\n(.*)$", output, re.M)
    assert found, output[-4000:]
    return found.group(1), found.group(2)


def interpreter(line: str) -> str:
    """The program a printed line runs: its first word after the ``NAME=VALUE`` prefixes."""
    return next(word for word in shlex.split(line) if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word))


def test_the_printed_replay_and_pytest_lines_run_pasted_into_a_new_shell(tmp_path):
    run, elsewhere, home = tmp_path / "run", tmp_path / "elsewhere", tmp_path / "home"
    for directory in (run, elsewhere, home):
        directory.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "MLA_FUSE_"))}
    failing = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", PROPERTY, "-p", "no:cacheprovider",
                              "-p", "no:xdist", "--mla-fuse-impl=mutant:sin_sign_flipped",
                              "--hypothesis-profile=mla_fuse.ci"],
                             cwd=run, env=env, capture_output=True, text=True, timeout=300)
    assert failing.returncode == 1 and "mla_fuse: reproduce this failure" in failing.stdout, \
        failing.stdout[-4000:] + failing.stderr[-2000:]

    replay, _ = printed(failing.stdout, "replay exactly")
    pytest_line, below = printed(failing.stdout, "or with pytest")

    replayed = fresh_shell(replay, elsewhere, home)  # exit 1 from a Python without the suite is not enough
    assert replayed.returncode == 1 and "REPRODUCED" in replayed.stdout, replayed.stdout + replayed.stderr

    rerun = fresh_shell(pytest_line, elsewhere, home)
    assert rerun.returncode == 1, rerun.stdout[-4000:] + rerun.stderr[-2000:]  # 2: a syntax error; 4: usage
    assert re.search(r"^FAILED .*test_fused_mla_matches_reference", rerun.stdout, re.M) \
        and "1 failed" in rerun.stdout, rerun.stdout[-4000:] + rerun.stderr[-2000:]

    for line in (replay, pytest_line):  # (a Python found on /usr/bin with the suite would hide a bare `python`)
        assert os.path.isabs(interpreter(line)) and "(" not in line, line
    assert below.strip().startswith("#"), below  # the note: a line of its own, a comment if pasted too


def test_the_interpreter_is_named_by_its_path_even_where_python_finds_it(monkeypatch):
    """An activated venv (``python`` on ``PATH`` is this interpreter) once got a bare ``python``."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    assert recording.python_command() == shlex.quote(os.path.abspath(sys.executable))


def test_every_printed_prefix_is_shell_quoted(tmp_path, monkeypatch):
    """``recording.assignments`` writes each ``NAME=VALUE`` of a printed command: the replay line's
    ``TRITON_INTERPRET`` and ``PYTHONPATH`` and the pytest line's database, each a word a shell reads back
    unchanged (a directory with a space and a ``$``)."""
    odd = tmp_path / "a dir $HOME"
    odd.mkdir()
    monkeypatch.setenv("MLA_FUSE_HYPOTHESIS_DB", str(odd))
    record = {"pythonpath": [str(odd)], "environment": {"TRITON_INTERPRET": "1 $x"}}
    words = shlex.split(recording.replay_command(odd / "f.json", record))
    assert words[:2] == ["TRITON_INTERPRET=1 $x", f"PYTHONPATH={odd}"], words
    assert shlex.split(recording.database_prefix("mla_fuse.dev")) == [f"MLA_FUSE_HYPOTHESIS_DB={odd}"]


def test_a_replay_sets_where_the_adapter_found_the_kernel_files(tmp_path, monkeypatch, no_kernel_paths):
    """``MLA_FUSE_SGLANG_PATH=DIR mla-fuse verify --impl sglang-triton`` printed replay lines without the
    variable: pasted into a new shell, the adapter looked for an installed SGLang and the replay exited 2
    (``SGLang is not found``). Every ``MLA_FUSE_<PROJECT>_PATH`` the run had is set in both printed lines
    and in a failing check's rerun line, as an absolute path; the run's other variables are not."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLA_FUSE_SGLANG_PATH", "unpacked")
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path / "failures"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    failure = {"property": "test_flash:test_fused_flash_matches_reference", "impl": "sglang-triton", "case": {}}
    record = json.loads(recording.save_failure(failure, "properties/test_flash.py::x", "mla_fuse.ci").read_text())
    from mla_fuse_conformance.commands.verify import console

    check = console.check_command("properties/test_large_addresses.py::test_cache_entries_past_the_threshold"
                                    "[flash-fused-fp8]", "sglang-triton", "mla_fuse.ci")
    for line in (record["replay"], record["pytest"], check):
        words = shlex.split(line)
        assert words[0] == f"MLA_FUSE_SGLANG_PATH={tmp_path / 'unpacked'}", line
        assert not any(word.startswith("MLA_FUSE_FAILURE_DIR") for word in words), line
    assert ("mla_fuse_conformance.properties.test_large_addresses::test_cache_entries_past_the_threshold"
            "[flash-fused-fp8]") in shlex.split(check), check


def test_a_failing_check_prints_what_it_varies_and_a_rerun_line(capsys, monkeypatch, no_kernel_paths):
    """A check that is not one property's examples (the addresses past 2^31) printed its node id and
    its first error line only: no command to rerun it (``Every failure is reproducible from what was
    printed``), and for a control that failed at small addresses nothing said so. Now its trigger (the
    check's docstring) and a pytest line that runs from anywhere."""
    from mla_fuse_conformance.commands.verify import console

    monkeypatch.setenv("MLA_FUSE_SGLANG_PATH", "/somewhere")
    nodeid = "properties/test_large_addresses.py::test_query_rows_a_huge_stride_apart"
    crashed = f"[gw0] linux -- Python 3.11\nworker 'gw0' crashed while running '{nodeid}'"  # xdist's message
    console.print_failures([{"outcome": "failed", "nodeid": nodeid, "message": crashed}], "sglang-triton", "mla_fuse.ci")
    out = capsys.readouterr().out
    assert f"{nodeid}: failed: worker 'gw0' crashed while running '{nodeid}'\n" in out, out
    assert ("      checks: Query rows a token stride apart that puts the last row 2^31 elements or more past the first, "
            "rotated as packed rows.\n") in out, out
    rerun = re.search(r"^      rerun: (.+)$", out, re.M).group(1)
    assert shlex.split(rerun)[0] == "MLA_FUSE_SGLANG_PATH=/somewhere" and \
        "mla_fuse_conformance.properties.test_large_addresses::test_query_rows_a_huge_stride_apart" in rerun, rerun
