"""Defects counted, not cells (docs/REPORT.md "defects"): cells with the same condition, or where one
implies the other, across properties and operations, are one defect; different triggers or different
failure kinds stay apart."""

from __future__ import annotations

from mla_fuse_conformance.commands.report.defects import count_line, defects, implies

FP8 = [["relation", "fp8 cache", "yes"], ["relation", "some slot written (slot >= 0)", "yes"]]


def cell(property_name, data, kind="wrong result", operations=("concat_and_cache_mla",), features=None, text=None):
    text = text or "; ".join(f"{name} {value}" for _, name, value in (data or []))
    return {"id": f"{property_name} | {kind} | {text}", "property": property_name, "operations": list(operations),
            "kind": kind, "condition": {"text": text, "data": data, "features": features or {}}}


def test_the_same_condition_in_three_properties_is_one_defect_listing_them():
    cells = [cell("test_mla:a", FP8), cell("test_mla:b", FP8, operations=("concat_and_cache_mla_rope_fused",)),
             cell("test_deployments:c", FP8)]
    found = defects(cells)
    assert len(found) == 1 and found[0]["cells"] == [c["id"] for c in cells]
    assert found[0]["properties"] == ["test_mla:a", "test_mla:b", "test_deployments:c"]
    assert found[0]["operations"] == ["concat_and_cache_mla", "concat_and_cache_mla_rope_fused"]
    assert count_line(found, cells) == "1 defect (3 failing cells)"


def test_a_narrower_cell_joins_the_wider_one_and_the_wider_names_the_defect():
    narrow = cell("test_mla:a", [*FP8, ["field", "block_size", ["16"]]])
    wide = cell("test_mla:b", FP8)
    assert implies(narrow, wide) and not implies(wide, narrow)
    found = defects([narrow, wide])
    assert len(found) == 1 and found[0]["condition"] == wide["condition"]["text"]


def test_field_values_imply_by_inclusion_and_exclusion():
    assert implies(cell("p", [["field", "block_size", ["16"]]]), cell("q", [["field", "block_size", ["16", "32"]]]))
    assert not implies(cell("p", [["field", "block_size", ["16", "32"]]]), cell("q", [["field", "block_size", ["16"]]]))
    assert implies(cell("p", [["field", "block_size", ["16"]]]), cell("q", [["field-not", "block_size", ["1"]]]))
    assert implies(cell("p", [["field-not", "rotary_dim", ["2", "4"]]]), cell("q", [["field-not", "rotary_dim", ["2"]]]))
    assert not implies(cell("p", [["field-not", "rotary_dim", ["2"]]]), cell("q", [["field-not", "rotary_dim", ["2", "4"]]]))


def test_different_triggers_and_different_kinds_stay_apart():
    cells = [cell("test_mla:a", FP8), cell("test_mla:a", [["field", "is_neox", ["yes"]]]),
             cell("test_mla:b", FP8, kind="raised RuntimeError")]
    assert len(defects(cells)) == 3
    crash = cell("test_mla:c", FP8, kind="crashed (SIGSEGV)")  # a wrong result and a crash are one family
    assert len(defects([cells[0], crash])) == 1


def test_two_cells_a_third_joins_become_one_defect():
    """fp8 and block 16 / fp8 and padded: neither implies the other; fp8 alone, found later, joins both."""
    a = cell("p", [["relation", "fp8 cache", "yes"], ["field", "block_size", ["16"]]])
    b = cell("q", [["relation", "fp8 cache", "yes"], ["relation", "a padded entry (slot < 0)", "yes"]])
    assert len(defects([a, b])) == 2
    joined = defects([a, b, cell("r", [["relation", "fp8 cache", "yes"]])])
    assert len(joined) == 1 and joined[0]["condition"] == "fp8 cache yes" and len(joined[0]["cells"]) == 3


def test_cells_of_feature_values_only():
    a = cell("p", None, features={"kv_cache_dtype": "fp8", "block_size": "16"}, text="kv_cache_dtype fp8, block_size 16")
    b = cell("q", None, features={"kv_cache_dtype": "fp8"}, text="kv_cache_dtype fp8")
    c = cell("r", None, features={"dtype": "float16"}, text="dtype float16")
    assert implies(a, b) and not implies(b, a) and len(defects([a, b, c])) == 2


def test_the_summary_page_and_console_count_defects_first():
    from mla_fuse_conformance.commands.report import defects as report_defects
    from mla_fuse_conformance.commands.report import html, markdown

    cells = [cell("test_mla:a", FP8), cell("test_interactions:b", FP8), cell("test_mla:a", [["field", "is_neox", ["yes"]]])]
    report = {"schema": 2, "verdict": "FAIL", "implementation": {"spec": "planted", "name": "planted"},
              "run": {"profile": "dev", "seconds": 1.0, "exit_code": 1}, "cells": cells, "defects": defects(cells)}
    summary = markdown.render(report)
    assert summary.splitlines()[0] == "## mla-fuse verify: planted: **FAIL**: 2 defects (3 failing cells)", summary
    assert "### Defects (2)" in summary and summary.index("### Defects") < summary.index("### Failing cells")
    page = html.render(report)
    assert '<span id="defect-count">2 defects (3 failing cells)</span>' in page and 'id="defects-table"' in page
    lines = report_defects.console_lines(report)
    assert lines[0] == "defects: 2 defects (3 failing cells)"
    assert lines[1].startswith("  1. fp8 cache yes; some slot written (slot >= 0) yes (wrong result): 2 cell(s) in 2 properties")
