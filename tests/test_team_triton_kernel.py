"""A team's own ``@triton.jit`` kernel, gated from the team's directory on a machine with no GPU and no
``TRITON_INTERPRET`` set by the user: ``mla-fuse verify`` sets ``TRITON_INTERPRET=1`` before the adapter is
imported (``running.devices.interpret_triton_without_a_gpu``), so the kernel runs under Triton's
interpreter as the suite's own do, and the header says so. Before, every example raised ``RuntimeError: 0
active drivers ([]). There should only be one.`` and the report blamed the kernel. The kernel uses what
Triton's interpreter gets wrong (a mask of a block and a scalar comparison, bfloat16 arithmetic): the run
corrects it as it corrects its own (``running/interpreter_corrections.py``; uncorrected, the correct kernel
raises or computes wrongly), and a planted bug (scale 1.5) is still found. tests/test_installed_use.py gates
the same module with the wheel installed in a fresh venv.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction, InterpreterError

from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

# the team's module ({scale}: 1.0 correct, 1.5 the planted bug); tests/test_installed_use.py gates it installed
ADAPTER = '''
import triton
import triton.language as tl
from mla_fuse_reference.adapter import ReferenceImplementation

SCALE = {scale}


@triton.jit
def scale_first(x_ptr, n, flag, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = (offsets < n) & (flag > 0)  # a mixed-width mask: the interpreter raises on it uncorrected
    values = tl.load(x_ptr + offsets, mask=mask)
    scaled = values * tl.full([BLOCK], SCALE, tl.bfloat16)  # bf16 arithmetic: on bit patterns uncorrected
    tl.store(x_ptr + offsets, tl.where(offsets == 0, scaled, values), mask=mask)


class TeamKernel(ReferenceImplementation):
    """The reference rope, then the team's kernel over the query's first row (a no-op at scale 1)."""
    capabilities = {{"dtypes": ("bfloat16",), "query_ranks": ("3",)}}
    concat_and_cache_mla = concat_and_cache_mla_rope_fused = None
    reshape_and_cache_flash = rope_and_reshape_and_cache_flash = None

    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        if query.numel() and query.is_contiguous():
            scale_first[(1,)](query, query[0].numel(), 1, SCALE=SCALE, BLOCK=1024)
'''


def team_kernel(directory, adapter: str):
    """The team's ``scale_first`` from the module ``adapter`` written into ``directory``, interpreted."""
    path = directory / "team_in_process.py"
    path.write_text(adapter)
    spec = importlib.util.spec_from_file_location("team_in_process", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return InterpretedFunction(module.scale_first.fn)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the corrections are the interpreter's")
def test_the_correct_team_kernel_needs_the_corrections(tmp_path):
    """What the run corrects is what this kernel needs to pass: on Triton's own interpreter it raises on its
    mask, and without that mask its bfloat16 product by 1.0 changes the value; corrected, it leaves the row
    as it was (as a GPU does)."""
    row = torch.tensor([1.5, -2.0, 3.0, 0.25], dtype=torch.bfloat16)
    kernel = team_kernel(tmp_path, ADAPTER.format(scale=1.0))
    corrected = row.clone()
    with corrected_interpreter():
        kernel[(1,)](corrected, row.numel(), 1, SCALE=1.0, BLOCK=8)
    assert torch.equal(corrected, row), corrected
    with uncorrected_interpreter(), pytest.raises(InterpreterError, match="mask has unsupported dtype"):
        kernel[(1,)](row.clone(), row.numel(), 1, SCALE=1.0, BLOCK=8)

    block_mask_only = ADAPTER.format(scale=1.0).replace("mask = (offsets < n) & (flag > 0)", "mask = offsets < n")
    assert "mask = offsets < n " in block_mask_only
    uncorrected = row.clone()
    with uncorrected_interpreter():
        team_kernel(tmp_path, block_mask_only)[(1,)](uncorrected, row.numel(), 1, SCALE=1.0, BLOCK=8)
    assert uncorrected[0] != row[0] and torch.equal(uncorrected[1:], row[1:]), uncorrected


def verify(directory, scale: float, **users) -> tuple[subprocess.CompletedProcess, dict]:
    """``mla-fuse verify`` of the team's kernel from ``directory``, in a shell with no ``TRITON_INTERPRET`` (nor
    the mark of one mla-fuse set) but the ``users`` variables."""
    (directory / "team.py").write_text(ADAPTER.format(scale=scale))
    env = {key: value for key, value in os.environ.items()
           if key not in ("TRITON_INTERPRET", "MLA_FUSE_SET_TRITON_INTERPRET", "CI")} | users
    done = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", "team:TeamKernel", "-n", "1",
                           "--map-rounds", "0", "--", "-k", "test_rotary_embedding_matches_reference"],
                          cwd=directory, env=dict(env, PYTHONPATH=str(directory)), capture_output=True, text=True,
                          timeout=900)
    return done, json.loads((directory / ".mla_fuse_reports" / "report.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs there: nothing is set")
def test_a_teams_triton_kernel_runs_under_the_interpreter_without_a_gpu(tmp_path):
    done, report = verify(tmp_path, 1.0)
    assert "0 active drivers" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert report["operations"]["rotary_embedding"]["verdict"] == "pass" and report["operations"]["rotary_embedding"]["examples"]
    assert "an adapter's @triton.jit kernels on Triton's interpreter (TRITON_INTERPRET=1, set by mla-fuse: no GPU)" \
        in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs there: nothing is set")
def test_a_bug_in_a_teams_triton_kernel_is_found_under_the_interpreter(tmp_path):
    done, report = verify(tmp_path, 1.5)
    assert done.returncode == 1 and report["operations"]["rotary_embedding"]["verdict"] == "FAIL", done.stdout[-3000:]
    assert {failure["kind"] for failure in report["failures"]} == {"wrong result"}, report["failures"]


def test_the_users_own_setting_wins(monkeypatch):
    from mla_fuse_conformance.running import devices

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert devices.interpret_triton_without_a_gpu() == "the GPU (TRITON_INTERPRET=0, yours)"
    assert os.environ["TRITON_INTERPRET"] == "0"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs there: nothing is set")
@pytest.mark.parametrize("users", [{}, {"TRITON_INTERPRET": "1"}], ids=["set-by-mla-fuse", "the-users"])
def test_a_replay_line_carries_the_users_triton_interpret(tmp_path, users):
    """The user's own ``TRITON_INTERPRET`` is part of what the run needed: the printed replay line sets it (on a
    GPU machine a replay without it would run the kernel on the GPU). One mla-fuse set is not printed:
    ``mla-fuse repro`` sets it again where there is no GPU."""
    done, report = verify(tmp_path, 1.5, **users)
    (failure,) = (tmp_path / ".mla_fuse_failures").glob("*.json")
    line = json.loads(failure.read_text())["replay"]
    assignments = list(itertools.takewhile(lambda word: "=" in word, shlex.split(line)))
    assert ("TRITON_INTERPRET=1" in assignments) == bool(users), line  # (beside any MLA_FUSE_*_PATH the shell has)
    assert (re.search(r"replay exactly: (\S+=\S+ )*TRITON_INTERPRET=1 ", done.stdout) is not None) == bool(users)
