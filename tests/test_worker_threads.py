"""An xdist worker of a suite session takes its share of torch's CPU threads
(``mla_fuse_conformance.plugin.share_cpu_threads``, ``running.devices.worker_threads``): with ``-n N``
each worker runs torch with its default thread count divided by N, a count the user set
(``OMP_NUM_THREADS``) is kept, and one process keeps torch's default; ``mla-fuse fuzz`` gives its
workers the same share. The suite's cases, reference and comparisons are CPU torch work
whatever the kernels' device, and N workers each starting one thread per core wait on each other."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mla_fuse_conformance.running.devices import THREAD_ENV, threads_per_worker

RECORDS_THREADS = """
import os

import torch


def record():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(os.environ["THREADS_OUT"], worker), "w") as out:
        out.write(str(torch.get_num_threads()))


def test_a():
    record()


def test_b():
    record()


def test_c():
    record()


def test_d():
    record()
"""


def _environment(**extra) -> dict:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("MLA_FUSE_") and key not in THREAD_ENV and not key.startswith("PYTEST_XDIST")}
    env.update(extra)
    return env


def _torch_default(env: dict) -> int:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                          env=env, capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout)


def _threads_seen(tmp_path, *options: str, **extra) -> dict[str, int]:
    out = tmp_path / f"threads{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    (tmp_path / "test_records_threads.py").write_text(RECORDS_THREADS)
    done = subprocess.run([sys.executable, "-m", "pytest", "test_records_threads.py", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "--mla-fuse-impl=reference", *options],
                          cwd=tmp_path, env=_environment(THREADS_OUT=str(out), **extra),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return {path.name: int(path.read_text()) for path in out.iterdir()}


def test_each_worker_takes_its_share_and_a_users_count_is_kept(tmp_path):
    default = _torch_default(_environment())
    if default < 2:
        pytest.skip(f"torch takes {default} CPU thread here: there is nothing for two workers to share")
    shared = _threads_seen(tmp_path, "-n", "2")
    assert shared and set(shared) <= {"gw0", "gw1"}, shared
    assert set(shared.values()) == {threads_per_worker(default, 2)}, (default, shared)
    assert threads_per_worker(default, 2) < default
    kept = _threads_seen(tmp_path, "-n", "2", OMP_NUM_THREADS=str(default))  # torch takes at most its default
    assert set(kept.values()) == {default}, (default, kept)
    alone = _threads_seen(tmp_path)
    assert alone == {"main": default}, (default, alone)


@pytest.mark.parametrize("threads, workers, share", [(16, 16, 1), (16, 4, 4), (2, 4, 1), (12, 5, 2), (1, 0, 1)])
def test_threads_per_worker(threads, workers, share):
    assert threads_per_worker(threads, workers) == share


def test_each_fuzz_worker_is_given_its_share(tmp_path, monkeypatch):
    """``mla-fuse fuzz`` starts its workers itself (not xdist): each gets its share as ``OMP_NUM_THREADS``."""
    import torch

    from mla_fuse_conformance.commands.fuzz import workers as fuzz_workers

    class Options:
        db, read_only = str(tmp_path / "db"), False

    for name in THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    shared = fuzz_workers.worker_environment(Options, None, False, tmp_path / "w.json", workers=2)
    share = str(threads_per_worker(torch.get_num_threads(), 2))
    assert shared.get("OMP_NUM_THREADS") == share, (share, shared.get("OMP_NUM_THREADS"))
    assert "OMP_NUM_THREADS" not in fuzz_workers.worker_environment(Options, None, False, tmp_path / "w.json")
    monkeypatch.setenv("MKL_NUM_THREADS", "5")
    kept = fuzz_workers.worker_environment(Options, None, False, tmp_path / "w.json", workers=2)
    assert "OMP_NUM_THREADS" not in kept and kept["MKL_NUM_THREADS"] == "5"
