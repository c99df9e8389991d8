"""One failing case, everywhere (``running/failure_text.py``): the case a failing property's section
prints, saves for replay and names in its ``failure:`` line is the one hypothesis reported, labelled,
and a wrong result's worst element is printed with its decoded values and fp8 codes.

Planted: a team's fp8 MLA cache write clamping ``x / scale`` to [-240, 448] (not [-448, 448]), under
a property with two failing explicit examples. hypothesis reports the simpler one (no NaN); the
suite once saved and printed the last one to fail (with a NaN) as its "shrunk case"."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.running import failure_text

CLAMP_240 = pathlib.Path(__file__).parent / "data" / "planted" / "clamp_240.py"

PROFILE = """
from hypothesis import Phase, settings

settings.register_profile("explicit", phases=[Phase.explicit], deadline=None, database=None)
"""

PROPERTY = """
import pytest
from hypothesis import given

from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.running.harness import examples

SIMPLE = {simple}
WITH_NAN = {with_nan}


@pytest.mark.mla_fuse("concat_and_cache_mla")
@examples([SIMPLE, WITH_NAN])
@given(case=strategies.mla_cases(fused=False))
def test_cache_write(mla_fuse, case):
    mla_fuse.against_reference(case, "concat_and_cache_mla")
"""

SIMPLE = MlaCase(seed=1, tokens=3, heads=1, latent=8, rotary_dim=4, dtype="float32", kv_cache_dtype="fp8",
                 num_blocks=2, block_size=4, slots=SlotSpec(length=3), table=TableSpec("plain", 4, 16),
                 values=ValueSpec(log2_magnitude=9.0))
WITH_NAN = MlaCase(seed=2, tokens=5, heads=1, latent=8, rotary_dim=4, dtype="float32", kv_cache_dtype="fp8",
                   num_blocks=2, block_size=4, slots=SlotSpec(length=5), table=TableSpec("plain", 4, 16),
                   values=ValueSpec(log2_magnitude=9.0, nan_count=1))


def test_the_section_saves_and_prints_the_case_hypothesis_reported(tmp_path):
    (tmp_path / "conftest.py").write_text(PROFILE)
    (tmp_path / "clamp_240.py").write_text(CLAMP_240.read_text())
    (tmp_path / "test_planted.py").write_text(PROPERTY.format(simple=repr(SIMPLE), with_nan=repr(WITH_NAN)))
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLA_FUSE_")}
    env.update(MLA_FUSE_FAILURE_DIR=str(tmp_path / "failures"), PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    done = subprocess.run([sys.executable, "-m", "pytest", "test_planted.py", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "--mla-fuse-impl=clamp_240:Kernels", "--hypothesis-profile=explicit"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 1 and "1 failed" in out, out[-4000:] + done.stderr[-2000:]
    assert "Falsifying explicit example" in out and "nan_count=1" not in out.partition("Falsifying explicit")[2] \
        .partition("mla_fuse: reproduce")[0], out[-4000:]  # hypothesis printed the simple one
    section = out.partition("mla_fuse: reproduce this failure")[2].partition("short test summary info")[0]  # CI=true: more
    assert "case:           MlaCase(seed=1, tokens=3," in section, section  # SIMPLE, as run (uint8 storage)
    assert "nan_count" not in section and "NaN inputs no" in section, section
    assert "run by the commands below and the reproducer: hypothesis' explicit example above" in section
    assert "impl -240 (code 0xf7 = 247), reference -448 (code 0xfe = 254)" in section, section
    (saved,) = (tmp_path / "failures").glob("*.json")
    record = json.loads(saved.read_text())
    assert record["case"]["values"] == json.loads(json.dumps(record["case"]["values"]))  # JSON as written
    assert record["case"]["seed"] == SIMPLE.seed and record["found_as"] == "hypothesis' explicit example"
    assert record["worst"][0]["got_code"] == 247 and record["worst"][0]["expected"] == -448.0


def test_an_exception_group_reports_its_first_tied_example_and_counts_them():
    first, second = AssertionError("a"), ValueError("b")
    failure_text.attach(first, {"case": 1})
    failure_text.attach(second, {"case": 2})
    first.add_note("Falsifying explicit example: test(case=1)")
    second.add_note("Falsifying example: test(case=2)")
    found = failure_text.reported(ExceptionGroup("Hypothesis found 2 distinct failures.", [first, second]))
    assert [(f["case"], f["found_as"]) for f in found] == [(1, "hypothesis' explicit example"),
                                                           (2, "hypothesis' shrunk example")]
    note = failure_text.case_note(dict(found[0], reported_failures=2))
    assert "hypothesis reported 2 distinct failures; this is the first of them" in note[1]
    assert failure_text.reported(RuntimeError("untied")) == []
