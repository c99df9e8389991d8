"""The per-operation counts of ``verify`` (console, summary.md) and its deployments line agree: a deployment
test skipped as ``not supported (declared)`` counts as a skip of its operation, not in an "other check" row
of its module (which showed ``test_deployments 0/0/1 skipped`` beside ``7 run: 4 pass, 3 fail; 1 not
supported (declared)``). Other skips (a check of no one operation, a profile that does not run it) keep
their module's row."""

from __future__ import annotations

from mla_fuse_conformance.commands.verify.summary import summarize

DEPLOYED = "properties/test_deployments.py::test_reshape_and_cache_flash_in_deployment[{}]"
LARGE = "properties/test_large_addresses.py::test_query_rows_a_huge_stride_apart"


def test_a_deployment_declared_out_counts_for_its_operation():
    outcomes = [
        {"nodeid": DEPLOYED.format("a"), "outcome": "failed", "metrics": None,
         "failure": {"operations": ["reshape_and_cache_flash"]}},
        {"nodeid": DEPLOYED.format("b"), "outcome": "skipped", "metrics": None, "failure": None,
         "reason": "not supported (declared): kv_cache_dtype fp8_e4m3"},
        {"nodeid": LARGE, "outcome": "skipped", "metrics": None, "failure": None,
         "reason": "large addresses: not run in the dev profile"},
    ]
    summaries = summarize(outcomes, "flaggems")
    flash = summaries["reshape_and_cache_flash"]
    assert (flash.passed, flash.failed, flash.skipped, flash.verdict) == (0, 1, 1, "FAIL")
    assert "test_deployments" not in summaries and summaries["addresses past 2^31"].skipped == 1, summaries
