"""The suite as a team uses it: a fresh venv, a non-editable install of the wheel, an empty
directory holding only their adapter modules.

One scenario, in steps: a correct outside adapter passes ``mla-fuse verify`` (exit 0) and the
plain ``pytest --pyargs mla_fuse_conformance`` run; a buggy one fails (exit 1) and the replay
command it printed, run as printed from another directory, reproduces the failure (exit 1); a
misspelled operation with ``--require`` fails; an adapter that does not import fails in one line
(exit 2). Then the team's first campaign, from a venv of its own with the ``fuzz`` extra: it passes
quietly on the correct adapter, and the lines it prints for the buggy one run from elsewhere. And a
team's own ``@triton.jit`` kernel on a machine with no GPU: it runs under Triton's interpreter, corrected,
with no ``TRITON_INTERPRET`` of the user's; it passes, and a bug planted in it is found.
Building the venv costs about two minutes; it is built once per session (a file lock keeps
xdist workers from building it twice). The Triton kernel's two gates, one property each, cost about
twenty seconds of CPU time together (up to a minute of wall time on a 2-core CPU busy with other runs).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from filelock import FileLock
from test_team_triton_kernel import ADAPTER as TRITON_ADAPTER

ROOT = pathlib.Path(__file__).resolve().parents[1]

ADAPTERS = {
    "my_kernels.py": '''
        import torch

        class MyKernels:
            """A team's MLA cache write in plain torch: source-bit caches only (declared)."""
            name = "my-kernels"
            capabilities = {"kv_cache_dtypes": ("auto", "bfloat16", "float16", "float32")}

            def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
                tokens = torch.nonzero(slot_mapping >= 0).flatten()
                slots = slot_mapping[tokens].long()
                block_size = kv_cache.size(1)
                entries = torch.cat([kv_c[tokens], k_pe[tokens]], dim=-1)
                kv_cache[slots // block_size, slots % block_size] = entries
    ''',
    "buggy_kernels.py": '''
        import torch
        from my_kernels import MyKernels

        class Buggy(MyKernels):
            """Block index computed with a block size of 16, whatever the cache's (docs/BUGS.md)."""
            def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
                tokens = torch.nonzero(slot_mapping >= 0).flatten()
                slots = slot_mapping[tokens].long()
                entries = torch.cat([kv_c[tokens], k_pe[tokens]], dim=-1)
                blocks = (slots // 16).clamp(max=kv_cache.size(0) - 1)
                kv_cache[blocks, slots % kv_cache.size(1)] = entries
    ''',
    "misspelled.py": '''
        from my_kernels import MyKernels

        class Kernels(MyKernels):
            def concat_and_cache_mla_rope_fuse(self, *args):  # one letter short
                raise AssertionError("never called")
    ''',
    "broken.py": '''
        import my_missing_kernel_library
    ''',
}


@pytest.fixture(scope="session")
def installed(tmp_path_factory, worker_id):
    """``bin/`` of a fresh venv with the wheel of this checkout installed, not editable."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    venv = shared / "installed-venv"
    with FileLock(str(shared / "installed-venv.lock")):
        if not (venv / "ready").exists():
            wheels = shared / "wheels"
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                           check=True, timeout=600)
            wheel = next(wheels.glob("mla_fuse-*.whl"))
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=600)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "torch==2.13.0", "triton==3.9.0",
                            f"{wheel}[test]"], check=True, timeout=1200)
            (venv / "ready").touch()
    return venv / "bin"


@pytest.fixture(scope="session")
def campaign_venv(installed, tmp_path_factory, worker_id):
    """``bin/`` of the venv a team keeps for campaigns: the gate's venv plus the fuzz extra, which holds
    hypothesis back (docs/FUZZING.md). A copy of the gate's venv in hard links (pip replaces files,
    it never writes into one, so the gate's venv is left as it was), then ``pip install WHEEL[fuzz]``."""
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    venv = shared / "campaign-venv"
    with FileLock(str(shared / "campaign-venv.lock")):
        if not (venv / "ready").exists():
            subprocess.run(["cp", "-al", str(installed.parent), str(venv)], check=True, timeout=600)
            (venv / "ready").unlink()
            wheel = next((shared / "wheels").glob("mla_fuse-*.whl"))
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[fuzz]"],
                           check=True, timeout=1200)
            (venv / "ready").touch()
    return venv / "bin"


@pytest.fixture
def team_dir(tmp_path):
    for name, text in ADAPTERS.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def _run(bin_dir, team_dir, *command, timeout=1200):
    """``command`` in the team's shell: nothing of this test session's environment (its PYTEST_, MLA_FUSE_ and
    PYTHON variables, the TRITON_INTERPRET the suite set), the venv's bin/ first on PATH."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "MLA_FUSE_", "PYTHON", "TRITON_INTERPRET"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", CI="true")
    return subprocess.run(command, cwd=team_dir, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def elsewhere(tmp_path_factory):
    """A directory that is not the team's: printed commands must run from any."""
    return tmp_path_factory.mktemp("elsewhere")


def test_a_team_gates_its_kernel_from_its_own_directory(installed, team_dir, elsewhere):
    site = _run(installed, team_dir, "python", "-c", "import mla_fuse, mla_fuse_conformance, mla_fuse_reference; "
                "print(mla_fuse.__file__, mla_fuse_conformance.__file__)")
    assert "site-packages" in site.stdout and str(ROOT) not in site.stdout, site  # not the checkout

    good = _run(installed, team_dir, "mla-fuse", "verify", "--impl", "my_kernels:MyKernels", "-n", "2")
    assert good.returncode == 0, good.stdout[-4000:] + good.stderr[-2000:]
    assert "operations found: concat_and_cache_mla" in good.stdout and "verdict: PASS" in good.stdout

    plain = _run(installed, team_dir, "pytest", "--pyargs", "mla_fuse_conformance", "--mla-fuse-impl=my_kernels:MyKernels",
                 "-n", "2", "-p", "no:cacheprovider", "-q", "-k", "mla_cache_write")
    assert plain.returncode == 0 and " passed" in plain.stdout, plain.stdout[-4000:]

    # one map round: the cell's own replay line is the map's; the map's rounds are tests/test_one_defect_one_map.py's
    buggy = _run(installed, team_dir, "mla-fuse", "verify", "--impl", "buggy_kernels:Buggy", "-n", "2", "--map-rounds", "1")
    assert buggy.returncode == 1 and "verdict: FAIL" in buggy.stdout, buggy.stdout[-4000:]
    printed = rf"replay: (PYTHONPATH={re.escape(str(team_dir))} (\S+) -m mla_fuse_conformance repro /\S+)$"
    found = re.search(printed, buggy.stdout, re.M)  # the interpreter by its path, activated venv or not
    assert found and pathlib.Path(found.group(2)).parent == installed, buggy.stdout[-4000:]
    replayed = _run(installed, elsewhere, "bash", "-c", found.group(1))  # as printed, from another directory
    assert replayed.returncode == 1 and "REPRODUCED" in replayed.stdout, replayed.stdout + replayed.stderr

    misspelled = _run(installed, team_dir, "mla-fuse", "verify", "--impl", "misspelled:Kernels", "--require",
                      "concat_and_cache_mla_rope_fused", "-n", "2", "--map-rounds", "0", "--",
                      "-k", "fused_mla_matches_reference")
    assert misspelled.returncode == 1, misspelled.stdout[-4000:]
    assert "'concat_and_cache_mla_rope_fuse' is not an operation of the contract; did you mean" in misspelled.stdout
    assert "required operation missing" in misspelled.stdout

    broken = _run(installed, team_dir, "mla-fuse", "verify", "--impl", "broken:Kernels")
    assert broken.returncode == 2 and broken.stdout == "", broken
    assert broken.stderr.strip().count("\n") == 0 and "my_missing_kernel_library" in broken.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs there: nothing is set")
def test_a_teams_triton_kernel_is_gated_under_the_interpreter_from_its_own_directory(installed, team_dir):
    """tests/test_team_triton_kernel.py's team kernel (a ``@triton.jit`` kernel in the adapter's module, with a
    mask of a block and a scalar comparison and bfloat16 arithmetic: uncorrected, the interpreter raises on the
    one and computes the other on bit patterns) gated by the installed ``mla-fuse verify`` in the team's shell,
    which has no ``TRITON_INTERPRET`` (``_run``: not the one this session set): mla-fuse sets it, and the
    header says so; the kernel passes, and the same kernel at scale 1.5 (its planted bug) fails on a wrong
    result. One property (``-n 0``: no worker to start, the pytest process mla-fuse starts runs the kernel)."""
    (team_dir / "team_triton.py").write_text(TRITON_ADAPTER.format(scale=1.0))
    # a module of its own: team_triton.py rewritten (the same size, perhaps the same second) could run as cached
    (team_dir / "team_triton_planted.py").write_text(TRITON_ADAPTER.format(scale=1.5))
    gate = ("--require", "rotary_embedding", "-n", "0", "--map-rounds", "0", "--", "-k",
            "test_rotary_embedding_matches_reference")
    report_file = team_dir / ".mla_fuse_reports" / "report.json"

    good = _run(installed, team_dir, "mla-fuse", "verify", "--impl", "team_triton:TeamKernel", *gate)
    assert good.returncode == 0 and "verdict: PASS" in good.stdout, good.stdout[-4000:] + good.stderr[-2000:]
    assert ("an adapter's @triton.jit kernels on Triton's interpreter (TRITON_INTERPRET=1, set by mla-fuse: no GPU)"
            in good.stdout), good.stdout[:2000]
    passed = json.loads(report_file.read_text())["operations"]["rotary_embedding"]
    assert passed["verdict"] == "pass" and passed["examples"], passed

    planted = _run(installed, team_dir, "mla-fuse", "verify", "--impl", "team_triton_planted:TeamKernel", *gate)
    assert planted.returncode == 1 and "verdict: FAIL" in planted.stdout, planted.stdout[-4000:]
    report = json.loads(report_file.read_text())
    assert report["operations"]["rotary_embedding"]["verdict"] == "FAIL", report["operations"]
    assert {failure["kind"] for failure in report["failures"]} == {"wrong result"}, report["failures"]


def _not_activated_env(bin_dir) -> dict[str, str]:
    """The environment of a shell where the venv of ``bin_dir`` is not activated."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "MLA_FUSE_", "PYTHON", "TRITON_INTERPRET"))}
    env.update(PATH=os.pathsep.join(entry for entry in env.get("PATH", "").split(os.pathsep)
                                    if entry and pathlib.Path(entry).resolve() != bin_dir.resolve()), CI="true")
    return env


def _run_not_activated(bin_dir, team_dir, *arguments, timeout=1200):
    """``<venv>/bin/python ARGS`` with the venv's bin/ not on PATH (a venv that is not activated)."""
    return subprocess.run([str(bin_dir / "python"), *arguments], cwd=team_dir, env=_not_activated_env(bin_dir),
                          capture_output=True, text=True, timeout=timeout)


def _shell(bin_dir, cwd, line, timeout=600):
    """A printed command line run as printed (``bash -c LINE``), the venv of ``bin_dir`` not activated."""
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=_not_activated_env(bin_dir), capture_output=True,
                          text=True, timeout=timeout)


def test_the_gate_gives_the_same_verdicts_from_a_venv_that_is_not_activated(installed, team_dir, elsewhere):
    """Nothing the suite runs or prints depends on the venv's bin/ being on PATH; a failure replays
    from another directory, by the printed line or by its file alone (it records the adapter's directory)."""
    gate = ("-m", "pytest", "--pyargs", "mla_fuse_conformance", "-n", "2", "-p", "no:cacheprovider", "-q",
            "-k", "mla_cache_write_matches_reference")
    good = _run_not_activated(installed, team_dir, *gate, "--mla-fuse-impl=my_kernels:MyKernels")
    assert good.returncode == 0 and " passed" in good.stdout, good.stdout[-4000:] + good.stderr[-2000:]
    buggy = _run_not_activated(installed, team_dir, *gate, "--mla-fuse-impl=buggy_kernels:Buggy")
    assert buggy.returncode == 1 and " failed" in buggy.stdout, buggy.stdout[-4000:]
    printed = r"replay exactly: (PYTHONPATH=(\S+) (\S+) -m mla_fuse_conformance repro (\S+))$"
    replay = re.search(printed, buggy.stdout, re.M)
    assert replay and pathlib.Path(replay.group(3)) == installed / "python", buggy.stdout[-4000:]
    assert replay.group(2) == str(team_dir) and pathlib.Path(replay.group(4)).is_absolute(), replay.group(1)
    replayed = _shell(installed, elsewhere, replay.group(1))
    assert replayed.returncode == 1 and "REPRODUCED" in replayed.stdout, replayed.stdout + replayed.stderr
    by_file = _run_not_activated(installed, elsewhere, "-m", "mla_fuse_conformance", "repro", replay.group(4))
    assert by_file.returncode == 1 and "REPRODUCED" in by_file.stdout, by_file.stdout + by_file.stderr


TEAM_PROJECT = {
    "conftest.py": '''
        def pytest_addoption(parser):
            parser.addoption("--impl", default="ours", help="the team's own option of the same name")
    ''',
    "test_team.py": '''
        import os
        import sys

        from hypothesis import given, settings, strategies as st

        @given(st.integers())
        def test_their_own_property(number):
            assert not settings.get_current_profile_name().startswith("mla_fuse.")  # hypothesis' own (ci under CI=true)
            assert not [name for name in os.environ if name.startswith("MLA_FUSE")]
            ours = [name for name in sys.modules if name.startswith(("torch", "triton", "mla_fuse"))]
            assert set(ours) <= {"mla_fuse_conformance", "mla_fuse_conformance.plugin",  # its option names and
                                 "mla_fuse_conformance.hookspecs",  # hook specs (standard library only)
                                 "mla_fuse_conformance.declarations", "mla_fuse_conformance.declarations.options"}, ours

        def test_their_impl_option(request):
            assert request.config.getoption("--impl") == "ours"
    ''',
}


def test_the_plugin_is_a_guest_in_a_team_project(installed, team_dir):
    """A project with its own ``--impl`` option and hypothesis tests: its own run sees no profile,
    environment variable, import or file of ours, and our gate runs beside it in the same project."""
    for name, text in TEAM_PROJECT.items():
        (team_dir / name).write_text(textwrap.dedent(text))
    before = set(team_dir.iterdir())
    theirs = _run_not_activated(installed, team_dir, "-m", "pytest", "test_team.py", "-p", "no:cacheprovider", "-q")
    assert theirs.returncode == 0 and "2 passed" in theirs.stdout, theirs.stdout[-4000:] + theirs.stderr[-2000:]
    written = {path.name for path in set(team_dir.iterdir()) - before}
    assert not {name for name in written if "mla_fuse" in name}, written
    gate = _run_not_activated(installed, team_dir, "-m", "pytest", "--pyargs", "mla_fuse_conformance",
                              "--mla-fuse-impl=my_kernels:MyKernels", "-n", "2", "-p", "no:cacheprovider", "-q",
                              "-k", "mla_cache_write_matches_reference")
    assert gate.returncode == 0 and " passed" in gate.stdout, gate.stdout[-4000:] + gate.stderr[-2000:]
    both = _run_not_activated(installed, team_dir, "-m", "pytest", "test_team.py", "--impl=theirs", "-p",
                              "no:cacheprovider", "-q", "-k", "not impl_option")
    assert both.returncode == 0, both.stdout[-4000:] + both.stderr[-2000:]


def _printed(output: str, label: str) -> str:
    found = re.search(rf"^\s*{label}: (.+)$", output, re.M)
    assert found, output[-4000:]
    return found.group(1)


def test_a_campaign_from_the_teams_directory_passes_quietly_and_prints_lines_that_run(campaign_venv, team_dir,
                                                                                      elsewhere):
    """``mla-fuse fuzz`` as a team runs it from its own directory with its campaign venv's python (not
    activated): on the correct adapter a short campaign passes and its worker's log holds no traceback
    and no warning (it ended on a KeyboardInterrupt traceback and a HypothesisWarning about listening
    for database changes); on the buggy one the pytest and replay lines it prints run as printed from
    another directory. The header names the hypothesis the fuzz extra holds it to."""
    fuzz = ("-m", "mla_fuse_conformance", "fuzz", "--db", "db", "--minutes", "0.25")
    good = _run_not_activated(campaign_venv, team_dir, *fuzz, "--impl", "my_kernels:MyKernels", "--out", "good")
    assert good.returncode == 0 and "verdict: PASS" in good.stdout, good.stdout[-4000:] + good.stderr[-2000:]
    held = r"^hypothesis [\d.]+, held by the fuzz extra to hypothesis<[\d.]+ "
    assert re.search(held, good.stdout, re.M), good.stdout[:2000]
    log = (team_dir / "good" / "worker-0.log").read_text()
    assert "Traceback" not in log and "Warning" not in log and log.rstrip().endswith("stopped by mla-fuse fuzz"), log

    buggy = _run_not_activated(campaign_venv, team_dir, *fuzz, "--impl", "buggy_kernels:Buggy", "--out", "buggy")
    assert buggy.returncode == 1 and "verdict: FAIL" in buggy.stdout, buggy.stdout[-4000:] + buggy.stderr[-2000:]
    pytest_line = _printed(buggy.stdout, "or with pytest")
    assert f"{campaign_venv / 'python'} -m pytest" in pytest_line, pytest_line
    rerun = _shell(campaign_venv, elsewhere, pytest_line)
    assert rerun.returncode == 1 and "1 failed" in rerun.stdout, rerun.stdout[-4000:] + rerun.stderr[-2000:]
    replayed = _shell(campaign_venv, elsewhere, _printed(buggy.stdout, "replay exactly"))
    assert replayed.returncode == 1 and "REPRODUCED" in replayed.stdout, replayed.stdout + replayed.stderr


def test_pip_takes_the_package_from_a_git_url_of_a_clone(installed, tmp_path):
    """``pip install "mla_fuse[test] @ git+file://localhost/PATH"``, the form of a ``git+https://``
    URL (pip 23.2, the venv's, refuses ``git+file:///PATH`` there; pip 26 takes both). A dry run in the
    gate's venv: pip clones the repository, builds the package's metadata from the clone and would
    install it with its extra; the rest of an install is the wheel's (the fixture's), which a second
    venv would repeat for about two minutes."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    report = tmp_path / "report.json"
    resolved = subprocess.run([str(installed / "python"), "-m", "pip", "install", "-q", "--dry-run", "--no-deps",
                               "--force-reinstall", "--report", str(report),
                               f"mla_fuse[test] @ git+file://localhost{clone}"],
                              capture_output=True, text=True, timeout=600)
    assert resolved.returncode == 0, resolved.stdout[-3000:] + resolved.stderr[-3000:]
    [package] = json.loads(report.read_text())["install"]
    assert package["metadata"]["name"] == "mla_fuse" and package["requested_extras"] == ["test"], package
    assert package["download_info"]["vcs_info"]["vcs"] == "git", package["download_info"]
