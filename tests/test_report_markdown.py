"""``summary.md`` (``commands/report/markdown.py``), its place in GitHub's job summary, and
``mla-fuse report DIR`` writing both views again from an existing report directory."""

from __future__ import annotations

import json
import pathlib
import shutil

from report_pages import cell, report

from mla_fuse_conformance.commands import cli

from mla_fuse_conformance.commands.report import markdown as report_markdown

from mla_fuse_conformance.commands.report import views as report_views

ROOT = pathlib.Path(__file__).resolve().parents[1]


def summary(tmp_path: pathlib.Path, found: dict) -> str:
    (tmp_path / "report.json").write_text(json.dumps(found))
    return report_markdown.write(tmp_path).read_text()


def table_rows(text: str) -> list[list[str]]:
    return [[part.strip() for part in line.strip("|").split(" | ")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| operation")]


def test_the_summary_states_the_verdict_what_ran_and_each_failing_cell_with_rate_and_replay(tmp_path):
    found = report()
    text = summary(tmp_path, found)
    assert text.startswith("## mla-fuse verify: vllm-cpu-amx: **FAIL**")
    assert "avx2 avx512f avx512_bf16 amx_bf16" in text and "torch 2.13.0+cpu" in text
    rows = [row for row in table_rows(text) if len(row) == 5 and row[-1].startswith("`")]  # not the defects
    assert [(row[1], row[3], row[4]) for row in rows] == [
        (c["condition"]["text"], f"{c['rate'][0]}/{c['rate'][1]}" if c["rate"] else "not measured",
         f"`{c['replay']['command']}`") for c in found["cells"]]
    # as the console counts them (issue 31, item 7): the declared-unsupported one did not run
    assert "Deployments: 2 run: 1 crash, 1 pass; 1 not supported (declared)" in text


def test_a_big_report_is_cut_with_a_pointer_to_the_page(tmp_path):
    found = report(cells=[cell(number, f"tokens {number} | heads", [1, 2], {}) for number in range(40)])
    text = summary(tmp_path, found)
    assert len(text.splitlines()) <= 60
    assert f"... {40 - report_markdown.MAX_ROWS} more, see report.html" in text
    assert "tokens 0 \\| heads" in text  # a | inside a cell does not split the row


def test_a_baseline_counts_new_known_and_now_passing(tmp_path):
    found = report()
    ids = [c["id"] for c in found["cells"]]
    found["baseline"] = {"from": "old/report.json", "known": ids[:2], "new": ids[2:], "now_passing": []}
    text = summary(tmp_path, found)
    assert "Against the baseline `old/report.json`: 1 new, 2 known, 0 now passing" in text
    assert [row[4] for row in table_rows(text) if row[-1].startswith("`")] == ["known", "known", "new"]
    found["baseline"]["from"] = ["old/report.json", "known.txt"]  # as baseline.py writes it: every source
    text = summary(tmp_path, found)
    assert "Against the baseline `old/report.json`, `known.txt`: 1 new" in text  # not a Python list


def test_verify_appends_the_summary_to_the_job_summary(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps(report()))
    job_summary = tmp_path / "step_summary.md"
    job_summary.write_text("earlier step\n")
    written = report_views.write(tmp_path, str(job_summary))
    assert [path.name for path in written] == ["report.html", "summary.md"]
    assert job_summary.read_text() == "earlier step\n" + written[1].read_text() + "\n"


def test_the_report_command_renders_a_committed_schema1_directory(tmp_path, capsys):
    for path in (ROOT / "tests" / "data" / "vllm-cpu-amx-schema1").glob("*.json"):
        shutil.copy(path, tmp_path)
    assert cli.main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"report: {tmp_path / 'report.html'}, {tmp_path / 'summary.md'}\n"
    text = (tmp_path / "summary.md").read_text()
    assert "schema 1 report" in text and "### Failing cells (10)" in text


def test_the_report_command_says_in_one_line_what_is_wrong_with_dir(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    (tmp_path / "report.json").write_text("{not json")
    assert cli.main(["report", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"mla-fuse report: DIR: {tmp_path} holds a report that cannot be read") and \
        error.count("\n") == 1


def test_an_unguarded_declared_limit_is_listed_with_its_replay_and_a_refused_one_is_not(tmp_path):
    limits = [{"operation": "concat_and_cache_mla", "axis": "kv_cache_dtype", "value": "fp8", "examples": 1,
               "outcome": "unguarded: wrong result", "detail": "wrong result: kv_cache: 12 entries differ",
               "file": "/r/failures/limit.json"},
              {"operation": "rotary_embedding", "axis": "table dtype", "value": "float32", "outcome": "refused",
               "detail": "RuntimeError: expected Float", "examples": 2, "file": None}]
    text = summary(tmp_path, report(limits=limits))
    section = text.split("### Unguarded declared limits (1)", 1)[1]
    assert "kv_cache_dtype fp8" in section and "unguarded: wrong result" in section
    assert "repro /r/failures/limit.json" in section and "table dtype" not in section
    assert "Unguarded declared limits" not in summary(tmp_path, report(limits=limits[1:]))
