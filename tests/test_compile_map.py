"""The conformance map of the compile-pass property: a failing ``CompileCase`` is mapped over its own
fields (``compile_passes/axes.py``: a layer's kind and situation, the rope form, the cache format, the
backend, the level...) and its failure names its features, where the map used to stop at
``AttributeError: 'CompileCase' object has no attribute 'slots'`` and the failure line read
``(any case)``.

The fast test plants the bug as a stand-in for the property's example (no compile: the map's logic
is what is tested); the nightly one maps a real planted pass bug end to end through ``mla-fuse verify``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mla_fuse_conformance.cases.features import AXES, describe, features
from mla_fuse_conformance.commands.conformance_map.property_map import map_property
from mla_fuse_conformance.compile_passes import axes
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.properties.test_compile_passes import EXPLICIT
from mla_fuse_conformance.running.harness import property_named

COMPILE = "test_compile_passes:test_passes_fuse_exactly_where_allowed_bitwise_and_copy_free"


def mha_fusion_broken(case) -> None:
    """A planted fusion bug: every MHA layer in the plain situation compiled at O2 or above is wrong."""
    if case.settings.level >= 2 and any(kind == "mha" and situation == "plain"
                                        for kind, situation in zip(case.model.kinds, case.model.situations)):
        raise AssertionError("compiled != eager: model output: 4 bytes differ")


def test_a_compile_failure_is_mapped_to_a_cell_over_the_compile_cases_fields(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prop, impl = property_named(COMPILE), load_implementation("triton")
    found = map_property(prop, impl, "cpu", mha_fusion_broken, max_examples=30, rounds=1)
    assert found.error is None and found.cells, found.lines()
    cell = found.cells[0]
    condition = {name: value for _, name, value in cell.diagnosis["condition"]}
    kinds = [name for name in condition if name.startswith("model.kinds[")]
    situations = [name for name in condition if name.startswith("model.situations[")]
    assert kinds and all(condition[name] == ["mha"] for name in kinds), condition
    assert situations and all("plain" in condition[name] for name in situations), condition
    assert "settings.level" in condition and set(condition["settings.level"]) == {"2", "3"}, condition
    title = cell.title()
    assert "model.kinds" in title and "settings.level" in title and "(any case)" not in title
    assert cell.features.get("layer kinds") == "mha" or cell.features.get("level") in ("O2", "O3"), cell.features


def test_the_compile_axes_share_no_name_with_the_kernel_cases_axes():
    assert not {axis.name for axis in axes.COMPILE_AXES} & {axis.name for axis in AXES}


def test_a_compile_case_has_features_that_name_it():
    case = EXPLICIT[0]
    found = features(case, rotates=False)
    assert found == {"layer kinds": "hybrid", "rope form": "native", "rope style": "gptj", "model dtype": "bfloat16",
                     "cache pool": "interleaved", "cache format": "fp8", "backend": "light", "token count": "dynamic",
                     "level": "O2", "fused layers": "all"}
    assert describe(found).startswith("layer kinds hybrid, rope form native")


@pytest.mark.nightly
def test_verify_maps_a_planted_pass_bug_to_a_cell_naming_compile_fields(tmp_path):
    """``mla-fuse verify`` with a real broken pass (``$MLA_FUSE_PASS_MUTANT``): the failure line names the
    case's features and the map a cell over its fields (about 4 minutes on 2 cores)."""
    env = dict(os.environ, MLA_FUSE_PASS_MUTANT="drops_the_q_write_back")
    env.pop("CI", None)
    done = subprocess.run([sys.executable, "-m", "mla_fuse_conformance", "verify", "-n", "1", "--map-rounds", "1",
                           "--", "-k", "test_passes_fuse"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / ".mla_fuse_reports" / "report.json").read_text())
    [failure] = report["failures"]
    assert failure["features"]["backend"] and "(any case)" not in done.stdout
    assert report["run"]["map"]["mapped"] == 1 and report["cells"], done.stdout[-3000:]
    assert any("settings.level" in cell["condition"]["text"] or "model." in cell["condition"]["text"]
               for cell in report["cells"]), [cell["condition"]["text"] for cell in report["cells"]]
