"""A cell you can trust: where a cell is shown (report.json, the page, summary.md, the console's
map, the reproducer's output) its worst elements are shown decoded, wrong against expected, an fp8
element as its value and its code (``-240 (code 0xf7 = 247)``), not the error's headline alone nor a
raw code.

Planted: a team's fp8 MLA cache write clamping ``x / scale`` to [-240, 448] instead of [-448, 448]
(``data/planted/clamp_240.py``); one example of it, saved as a map cell the way ``verify`` saves one."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from report_pages import parse, report

from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec, ValueSpec
from mla_fuse_conformance.commands.conformance_map import property_map
from mla_fuse_conformance.commands.report import document
from mla_fuse_conformance.commands.report import html as report_html
from mla_fuse_conformance.commands.report import markdown as report_markdown
from mla_fuse_conformance.commands.repro import script as reproducer
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running import recording
from mla_fuse_conformance.running.harness import property_named

PLANTED = pathlib.Path(__file__).parent / "data" / "planted"
SATURATING = MlaCase(seed=1, tokens=3, heads=1, latent=8, rotary_dim=4, dtype="float32", kv_cache_dtype="fp8",
                     num_blocks=2, block_size=4, slots=SlotSpec(length=3), table=TableSpec("plain", 4, 16),
                     values=ValueSpec(log2_magnitude=9.0), cache_storage="uint8")  # |x| up to ~2^11: saturates
WRONG = "impl -240 (code 0xf7 = 247), reference -448 (code 0xfe = 254)"


@pytest.fixture
def planted_cell(tmp_path, monkeypatch) -> property_map.PropertyMap:
    """The map of the planted bug's one failing example, its cell saved as the map saves one."""
    monkeypatch.syspath_prepend(str(PLANTED))
    monkeypatch.setenv(recording.FAILURE_DIR_ENV, str(tmp_path / "failures"))
    prop = property_named("test_mla:test_mla_cache_write_matches_reference")
    impl, recorder = load_implementation("clamp_240:Kernels"), recording.Recorder()
    with pytest.raises(AssertionError):
        prop.run(impl, "cpu", SATURATING, recorder=recorder)
    failure = dict(recorder.last_failure, cell={"kv_cache_dtype": "fp8"}, trigger="kv_cache_dtype fp8")
    cell = property_map._saved_cell(prop, failure, None, "shrunk")
    return property_map.PropertyMap(prop.name, prop.operations, [cell], {}, 1, True)


def test_report_json_keeps_the_error_text_and_the_worst_elements_decoded(planted_cell):
    (found,) = document.cells([planted_cell])
    assert found["error"].startswith("implementation differs from the reference (CONTRACT §5):\n")
    assert WRONG in found["error"]  # the headline alone was kept before
    (worst,) = found["worst"]
    assert (worst["argument"], worst["got"], worst["expected"], worst["got_code"], worst["expected_code"]) == \
        ("kv_cache", -240.0, -448.0, 247, 254)
    assert worst["failing"] > 0 and worst["of"] >= worst["failing"] and len(worst["index"]) == 3
    json.dumps(found, allow_nan=False)  # NaN or inf would be text


def test_the_page_the_summary_and_the_console_show_the_decoded_values(planted_cell, tmp_path):
    found = report(cells=document.cells([planted_cell]))
    (tmp_path / "report.json").write_text(json.dumps(found))
    page = parse(report_html.write(tmp_path).read_text())
    detail = page.find("section", data_cell_id=found["cells"][0]["id"])
    assert WRONG in detail.find("pre", class_="error").content()
    rows = [[td.content() for td in row.find_all("td")] for row in detail.find_all("tr")]
    decoded = ["-240.0 (code 0xf7 = 247)", "-448.0 (code 0xfe = 254)"]  # got, expected
    assert any(row[2:4] == decoded for row in rows if len(row) == 5), rows
    summary = report_markdown.write(tmp_path).read_text()
    block = summary.partition("```text\n")[2].partition("```")[0]
    assert WRONG in block, summary
    console = "\n".join(planted_cell.lines())
    assert "worst: fp8 codes wrong (kv_cache entries, e4m3)" in console and WRONG in console, console


def test_the_reproducer_prints_fp8_codes_with_their_values_worst_first(planted_cell, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PLANTED))
    found = report(cells=document.cells([planted_cell]))
    found["implementation"] = {"spec": "clamp_240:Kernels", "module_path": str(PLANTED / "clamp_240.py")}
    script = reproducer.write_reproducers(tmp_path, found)["cells"][0]["reproducer"]
    assert script["reproduced"] and script["passes_with_reference"], script
    ran = subprocess.run([sys.executable, script["script"]], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(PLANTED)))  # the adapter importable by its module name
    lines = ran.stdout.splitlines()
    assert ran.returncode == 1 and lines[0].endswith("got code 247 (-240.0), expected code 254 (-448.0)"), ran.stdout
    assert "got 247" not in ran.stdout


def test_an_excerpt_is_bounded_and_marked_where_cut():
    from mla_fuse_conformance.running.failure_text import excerpt

    text = "\n".join(f"line {n}" for n in range(40))
    assert excerpt(text).splitlines()[-1] == "line 11 [...]" and excerpt("one\ntwo") == "one\ntwo"
    assert len(excerpt("x" * 5000)) <= 2000 + len(" [...]")
