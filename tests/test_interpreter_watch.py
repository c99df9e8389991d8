"""No verdict from the interpreter's speed (``running/interpreter_watch.py``): under Triton's interpreter
an example that keeps starting programs is working, however long it takes, and is called hung only when
it stops making progress; one estimated past its budget is not judged.

The planted kernels are interpreted Triton kernels (``InterpretedFunction``, as mla_fuse's own are on a CPU)
that sleep in each program: slow but correct, far too slow, or spinning in one program.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import triton.language as tl
from hypothesis.errors import UnsatisfiedAssumption
from triton.runtime.interpreter import InterpretedFunction

from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running.executor import Executor, Hung
from mla_fuse_conformance.running.harness import property_named
from mla_fuse_conformance.running.interpreter_watch import InterpreterWatch, TooSlowUnderInterpreter

from test_conformance_map import RANK3, ROPE_PROPERTY

PROGRAM_SECONDS = 0.05


def _sleepy(out_ptr):
    pid = tl.program_id(0)
    time.sleep(PROGRAM_SECONDS)
    tl.store(out_ptr + pid, pid + 1)


SLEEPY = InterpretedFunction(_sleepy)


def test_a_launch_reports_progress_and_finishes_within_its_budget():
    beats: list[float] = []
    watch = InterpreterWatch(lambda: beats.append(time.monotonic())).install()
    watch.start(30.0)
    out = torch.zeros(40, dtype=torch.int32)
    SLEEPY[(40,)](out)
    watch.stop()
    assert torch.equal(out, torch.arange(1, 41, dtype=torch.int32))
    assert len(beats) >= 2  # about 2 s of programs: a heartbeat every 0.5 s


def test_a_launch_estimated_past_the_budget_is_stopped_early_as_not_judged():
    watch = InterpreterWatch().install()
    watch.start(1.5)
    started = time.monotonic()
    with pytest.raises(TooSlowUnderInterpreter) as slow:
        SLEEPY[(400,)](torch.zeros(400, dtype=torch.int32))
    assert time.monotonic() - started < 5  # 400 programs would take 20 s
    assert 10 < slow.value.estimated < 40 and slow.value.programs == 400
    assert str(slow.value).startswith("not judged: too slow under the interpreter (estimated ")


ADAPTER = '''
import time
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from mla_fuse_reference.adapter import ReferenceImplementation

PROGRAMS = {"slow": 20, "too_slow": 5000, "spins": 4}


def _program(out_ptr, how: tl.constexpr):
    pid = tl.program_id(0)
    if how == "spins" and pid == 1:
        while True:  # one program that never ends
            time.sleep(0.01)
    time.sleep(0.2)
    tl.store(out_ptr + pid, pid)


PROGRAM = InterpretedFunction(_program)


def interpreted(how):
    class Interpreted(ReferenceImplementation):
        concat_and_cache_mla = concat_and_cache_mla_rope_fused = None
        reshape_and_cache_flash = rope_and_reshape_and_cache_flash = None

        calls = 0

        def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
            import torch
            type(self).calls += 1
            if type(self).calls <= self.slow_calls:
                PROGRAM[(PROGRAMS[how],)](torch.zeros(PROGRAMS[how], dtype=torch.int32), how)
            super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
    return Interpreted


Slow, TooSlow, Spins = interpreted("slow"), interpreted("too_slow"), interpreted("spins")
Slow.slow_calls = TooSlow.slow_calls = Spins.slow_calls = 10 ** 9


class SlowTwice(interpreted("slow")):
    """Slow in its first two calls of a process only (a pytest run's first examples)."""
    slow_calls = 2


class TooSlowOnce(interpreted("too_slow")):
    """Far too slow in its first call of a process only."""
    slow_calls = 1
'''


@pytest.fixture
def interpreted_adapters(tmp_path, monkeypatch):
    (tmp_path / "interpreted.py").write_text(ADAPTER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MLA_FUSE_FAILURE_DIR", str(tmp_path / "failures"))
    monkeypatch.setenv("MLA_FUSE_EXAMPLE_TIMEOUT", "1.5")  # each kernel below runs past it
    monkeypatch.setenv("MLA_FUSE_INTERPRETER_BUDGET", "30")
    return tmp_path


def run_in_child(spec: str):
    prop = property_named(ROPE_PROPERTY)
    with Executor(load_implementation(spec).spec, "cpu") as executor:
        started = time.monotonic()
        try:
            executor.run(prop.name, RANK3)
        finally:
            elapsed = time.monotonic() - started
    return elapsed


def test_a_slow_but_correct_kernel_is_not_called_hung(interpreted_adapters):
    assert run_in_child("interpreted:Slow") > 3  # 20 programs of 0.2 s: past the 1.5 s example timeout


def test_a_kernel_that_really_spins_is_called_hung(interpreted_adapters):
    with pytest.raises(Hung):
        run_in_child("interpreted:Spins")


def test_a_kernel_estimated_past_the_budget_is_not_judged(interpreted_adapters):
    with pytest.raises(UnsatisfiedAssumption, match="not judged: too slow under the interpreter"):
        run_in_child("interpreted:TooSlow")


def run_pytest(directory, spec: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(directory), MLA_FUSE_HYPOTHESIS_DB=str(directory / "db"),
               MLA_FUSE_REPORT_DIR=str(directory / "reports"))
    env.pop("CI", None)
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "mla_fuse_conformance.properties.test_rotary_embedding",
                           "-p", "no:cacheprovider", "-q", "-k", "test_rotary_embedding_matches_reference",
                           f"--mla-fuse-impl={spec}", "--hypothesis-profile=mla_fuse.dev", "--hypothesis-seed=0"],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=1200)


def test_under_pytest_an_example_too_slow_to_interpret_is_counted_not_judged(interpreted_adapters):
    done = run_pytest(interpreted_adapters, "interpreted:TooSlowOnce")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    [line] = [json.loads(text) for text in (interpreted_adapters / "reports" / "outcomes.jsonl").read_text().splitlines()]
    assert line["metrics"]["not_judged"] == 1 and line["metrics"]["not_judged_estimate"] > 30, line["metrics"]


def test_under_pytest_a_slow_but_correct_kernel_is_not_called_hung(interpreted_adapters):
    """The plugin's hang watchdog (faulthandler, 1.5 s here) restarts at each program: the property's first
    two examples take 4 s each and the run passes, where the watchdog used to end the process as hung."""
    done = run_pytest(interpreted_adapters, "interpreted:SlowTwice")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
