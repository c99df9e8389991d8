"""``ci/gpu_tables.py``: docs/GPU.md's table of the GPU runner's targets, from the reports of ``ci/gpu.sh`` runs.

The verify and repro steps' lines and ``steps.tsv`` come from ``ci/gpu.sh`` itself, run with a fake
``mla-fuse`` (no GPU needed: what is checked is that the script's reports are what the table reads);
the other steps' logs are written here in the formats their scripts print (``bench_validation.py``'s,
``gpu_compile_check.py``'s and the keys step's ``summary:`` lines); the bench rows are the real ones of
the H200 run kept in ``benchmarks/results/gpu-2026-11-27``.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))

import gpu_tables  # noqa: E402

KEPT_RUN = ROOT / "benchmarks" / "results" / "gpu-2026-11-27"
OP = "concat_and_cache_mla_rope_fused"

FAKE_MLA_FUSE = """#!/usr/bin/env bash
case " $* " in
  *" mutant:"*)  # the repro step: two reproducers, each naming DEVICE='cuda', both reproduced
    dir=$(printf '%s\\n' "$@" | sed -n '/--report-dir/{n;p}'); mkdir -p "$dir/reproducers"
    for n in 1 2; do
      echo "DEVICE = 'cuda'" > "$dir/reproducers/r$n.py"; echo "reproducer: $dir/reproducers/r$n.py (reproduced)"
    done
    exit 1 ;;
  *)  # the verify step: compiles $KERNELS kernels into Triton's cache, a property fails
    mkdir -p "$TRITON_CACHE_DIR"
    for n in $(seq "$KERNELS"); do touch "$TRITON_CACHE_DIR/k$n.cubin"; done
    echo "verdict: FAIL"; exit 1 ;;
esac
"""

DISPATCH_LOG = f"""\
summary: empty op, same schema (dispatch only): 4.2 us host CPU, 4.2 us wall per call (T=1, H=128, NVIDIA H200)
summary: torch.ops.mla_fuse.{OP}: 14.2 us host CPU, 14.9 us wall per call (T=1, H=128, NVIDIA H200)
summary: mla_fuse.ops.{OP}: 21.5 us host CPU, 22.0 us wall per call (T=1, H=128, NVIDIA H200)
"""

COMPILE_LOG = """\
mla_fuse compile check: cuda, torch 2.11.0+cu130, 4 layers, hidden 1024, 16 heads, nope 128, rope 64, latent 512, T=32, 26 s
  eager               ok          1.8s  bytes recorded
  O1                  ok         13.5s  no fusion
  O2 fuses            ok          7.5s  4 fused
  O2 == O1            ok          0.0s  4 layers equal
  second token count  ok          3.3s  T=35
  CUDA graph          ok          0.4s  replayed: same bytes
49 passed, 2 xfailed in 52.10s
"""

KEYS_LOG = """\
summary: test_mla_cache_write_matches_reference, gpu profile, seed 0, first run: 31 kernels in the cache
summary: test_mla_cache_write_matches_reference, gpu profile, seed 0, again run: 31 kernels in the cache
"""

TILES_LOG = """\
summary: T=16384 H=16 fp8: config (1, 16, 4) 70% of copy (  40.0 us); best (2, 16, 8) 88% of copy (  31.8 us)
"""


def gpu_run(tmp_path: pathlib.Path, name: str, kernels_before: int = 0, kernels: int = 3) -> pathlib.Path:
    """A run's reports: ci/gpu.sh's verify and repro steps (a fake ``mla-fuse``), then the other logs."""
    tree = tmp_path / f"tree-{name}"
    (tree / "ci").mkdir(parents=True)
    shutil.copy(ROOT / "ci" / "gpu.sh", tree / "ci" / "gpu.sh")
    (tree / "bin").mkdir()
    (tree / "bin" / "mla-fuse").write_text(FAKE_MLA_FUSE)
    (tree / "bin" / "mla-fuse").chmod(0o755)
    (tree / "bin" / "python3").symlink_to(sys.executable)
    cache = tree / "triton"
    cache.mkdir()
    for n in range(kernels_before):
        (cache / f"before{n}.cubin").touch()
    env = {"PATH": f"{tree / 'bin'}:/usr/bin:/bin", "HOME": str(tree), "MLA_FUSE_INSTALLED": "1",
           "MLA_FUSE_GPU_STEPS": "verify repro", "TRITON_CACHE_DIR": str(cache), "KERNELS": str(kernels)}
    result = subprocess.run(["bash", str(tree / "ci" / "gpu.sh")], cwd=tree, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr  # the verify step failed: a property failed
    run = tmp_path / name
    shutil.copytree(tree / "reports", run)
    assert [line.split("\t")[:2] for line in (run / "gpu" / "steps.tsv").read_text().splitlines()] == \
        [["verify", "FAILED (1)"], ["repro", "ok"]]
    assert (run / "gpu" / "summary.txt").read_text().startswith("== summary")
    # what the machine's python3 said is a CPU's: the run's machine is a GPU's
    (run / "gpu" / "versions.txt").write_text("torch 2.11.0+cu130 triton 3.6.0 hypothesis 6.168.3 mla_fuse 0.1.0 "
                                              "device NVIDIA H200\n")
    for step, text in (("dispatch", DISPATCH_LOG), ("compile", COMPILE_LOG), ("keys", KEYS_LOG),
                       ("tiles", TILES_LOG)):
        (run / "gpu" / f"{step}.log").write_text(text)
    return run


def rows(text: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("| ")
            for cells in [[cell.strip() for cell in line.strip("|").split("|")]]}


def test_each_target_reads_the_newest_run_that_measured_it(tmp_path):
    """Every target's figure and verdict from the newest run that has it, naming that run; the bench
    rows, which the newer run lacks, from the kept H200 run (the figures docs/GPU.md gives for it)."""
    newer = gpu_run(tmp_path, "gpu-2026-12-01")
    table = rows(gpu_tables.table([gpu_tables.Run(str(KEPT_RUN)), gpu_tables.Run(str(newer))]))
    new, kept = "gpu-2026-12-01 (NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0)", \
        "gpu-2026-11-27 (NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0)"
    assert table["eager `torch.ops` call, T=1, H=128"][1:] == ["14.2 us host CPU (14.9 us wall)", "met", new]
    assert table["eager `mla_fuse.ops` call, T=1, H=128"][1:] == ["21.5 us host CPU (22.0 us wall)", "**not met**", new]
    assert table["fused over the unfused pair, CUDA graphs, T <= 256"][1:] == [
        "1.29-1.42x over 12 rows; lowest H=128 auto T=1", "**not met**", kept]
    assert table["fused, share of a same-byte copy, CUDA graphs, T >= 16384"][1:] == [
        "65%-81% over 4 rows; lowest H=16 fp8 T=16384", "**not met**", kept]
    figure, verdict, run = table["`mla-fuse verify --profile gpu`, whole, empty Triton cache"][1:]
    assert figure.endswith(" s, exit 1 (a property failed), 3 kernels compiled") and (verdict, run) == ("met", new)
    assert table["the same seed again on that cache (keys step)"][1:] == [
        "31 kernels on the empty cache, 0 more on the rerun", "met", new]
    assert table["compile path on CUDA Inductor (`ci/gpu_compile_check.py`, pass tests)"][1:] == [
        "6 of 6 checks ok; pass tests: 49 passed, 2 xfailed", "met", new]
    assert table["reproducers' CUDA path (a planted bug)"][1:] == ["2 reproducers, 2 reproduced, 2 on CUDA", "met", new]
    text = gpu_tables.table([gpu_tables.Run(str(KEPT_RUN))])
    assert rows(text)["eager `torch.ops` call, T=1, H=128"][1:] == [gpu_tables.NOT_MEASURED, "-", "-"]
    assert "- T=16384 H=16 fp8: config (1, 16, 4)" in gpu_tables.table([gpu_tables.Run(str(newer))])


def test_a_verify_on_a_cache_that_held_kernels_is_not_a_cold_figure(tmp_path):
    """The cold-verify target reads only a verify that compiled every kernel in the cache."""
    warm = gpu_run(tmp_path, "warm", kernels_before=5)
    table = rows(gpu_tables.table([gpu_tables.Run(str(warm))]))
    assert table["`mla-fuse verify --profile gpu`, whole, empty Triton cache"][1:] == [gpu_tables.NOT_MEASURED, "-",
                                                                                      "-"]


def test_a_log_without_its_figure_says_so_and_a_cpu_run_is_refused(tmp_path):
    """A log in another format is named, not taken for a missing measurement; a failed check fails its
    target; reports of a run on a CPU are refused."""
    run = tmp_path / "changed"
    (run / "gpu").mkdir(parents=True)
    (run / "gpu" / "versions.txt").write_text("torch 2.15.0 triton 3.9.0 device NVIDIA H100\n")
    (run / "gpu" / "dispatch.log").write_text("torch.ops call: 14 us\n")  # another format
    (run / "gpu" / "compile.log").write_text(COMPILE_LOG.replace("ok          0.4s", "FAILED      0.1s")
                                             .replace("49 passed, 2 xfailed", "1 failed, 48 passed"))
    table = rows(gpu_tables.table([gpu_tables.Run(str(run))]))
    assert table["eager `torch.ops` call, T=1, H=128"][1:3] == ["no figure in changed/gpu/dispatch.log", "-"]
    assert table["compile path on CUDA Inductor (`ci/gpu_compile_check.py`, pass tests)"][1:3] == [
        "5 of 6 checks ok (failed: CUDA graph); pass tests: 1 failed, 48 passed", "**not met**"]
    (run / "gpu" / "versions.txt").write_text("torch 2.13.0+cpu triton 3.9.0 mla_fuse 0.1.0 device none\n")
    with pytest.raises(SystemExit, match="without a GPU"):
        gpu_tables.Run(str(run))


def test_write_replaces_only_the_generated_part_and_refuses_a_file_without_markers(tmp_path, capsys):
    """``--write`` keeps what lies outside the markers, writes the same twice, and writes nothing without them."""
    doc = tmp_path / "GPU.md"
    doc.write_text(f"# GPU\nbefore\n{gpu_tables.BEGIN}\nold table\n{gpu_tables.END}\nafter\n")
    assert gpu_tables.main([str(KEPT_RUN), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"# GPU\nbefore\n{gpu_tables.BEGIN}\n| target |") and text.endswith(f"{gpu_tables.END}\nafter\n")
    assert "old table" not in text and "1.29-1.42x" in text
    assert gpu_tables.main([str(KEPT_RUN), "--write", str(doc)]) == 0 and doc.read_text() == text  # stable
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    with pytest.raises(SystemExit, match="nothing written"):
        gpu_tables.main([str(KEPT_RUN), "--write", str(plain)])
    assert plain.read_text() == "no markers\n"
    with pytest.raises(SystemExit):
        gpu_tables.main([str(tmp_path / "absent")])
    assert "runs: no such directory" in capsys.readouterr().err


def test_docs_gpu_md_holds_the_table_the_kept_runs_give():
    """docs/GPU.md's generated part is what ``ci/gpu_tables.py benchmarks/results/gpu-*`` writes today."""
    runs = sorted(str(path) for path in (ROOT / "benchmarks" / "results").glob("gpu-*"))
    text = (ROOT / "docs" / "GPU.md").read_text()
    assert f"{gpu_tables.BEGIN}\n{gpu_tables.table([gpu_tables.Run(run) for run in runs])}\n{gpu_tables.END}" in text
