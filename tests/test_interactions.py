"""The covering arrays of interactions (``cases/interactions.py``): current, complete, and sized.

The committed rows (``cases/interaction_rows.json``) must be what ``ci/generate_interactions.py``
writes today; the cases built from them must hold every pair of parameter values one case can hold;
the product levels must pass the tiles the single-dimension crossings stay below.
"""

from __future__ import annotations

import importlib.util
import itertools
import pathlib

import pytest

from mla_fuse_conformance.cases import covering, interactions
from mla_fuse_conformance.cases.boundaries import crossings
from mla_fuse_conformance.declarations.operations import OPERATIONS

GENERATOR = pathlib.Path(__file__).parents[1] / "ci" / "generate_interactions.py"


def _generator():
    spec = importlib.util.spec_from_file_location("generate_interactions", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("operation", OPERATIONS)
def test_committed_rows_are_current(operation):
    rows = interactions.cover_rows(operation)
    assert interactions.committed_rows(operation) == rows, (
        f"cases/interaction_rows.json is stale for {operation}: run `python ci/generate_interactions.py`")


def test_generator_writes_the_committed_module():
    rows = {operation: interactions.committed_rows(operation) for operation in OPERATIONS}
    pairs = {operation: interactions.committed_pairs(operation) for operation in OPERATIONS}
    assert _generator().render(rows, pairs) == interactions.ROWS_FILE.read_text()


@pytest.mark.parametrize("operation", OPERATIONS)
def test_every_pair_is_held(operation):
    coverage = interactions.pair_coverage(interactions.interaction_cases(operation), operation)
    assert coverage["strength"] == 2 and coverage["total"] > 0
    assert coverage["missing"] == [] and coverage["covered"] == coverage["total"], coverage["missing"][:5]
    assert interactions.committed_pairs(operation) == coverage["total"], "the report's pair count is stale"


def test_coverage_names_what_is_missing():
    """The boundary cases hold few pairs: one size with every feature minimal."""
    operation = "concat_and_cache_mla"
    coverage = interactions.pair_coverage(crossings(operation), operation)
    assert 0 < coverage["covered"] < coverage["total"]
    assert "kv_cache_dtype fp8 + size tokens 513" in coverage["missing"]
    assert len(coverage["missing"]) == coverage["total"] - coverage["covered"]


@pytest.mark.parametrize("operation", ["concat_and_cache_mla_rope_fused", "rope_and_reshape_and_cache_flash"])
def test_a_size_crossing_meets_an_fp8_cache_with_a_scale(operation):
    cases = interactions.interaction_cases(operation)
    design = interactions.Design.of(operation)
    assert any(case.tokens > 512 and interactions.values_of(case, design).get("scale") == "other"
               for case in cases)


@pytest.mark.parametrize("operation", ["rotary_embedding", "concat_and_cache_mla_rope_fused",
                                       "rope_and_reshape_and_cache_flash"])
def test_heads_times_rotary_pairs_passes_what_single_crossings_reach(operation):
    def heads_x_pairs(case):
        rotary_dim = case.rotary_dim if hasattr(case, "latent") else case.table.rotary_dim
        return case.heads * (rotary_dim // 2)
    single = max(heads_x_pairs(case) for case in crossings(operation))
    paired = max(heads_x_pairs(case) for case in interactions.interaction_cases(operation))
    assert single < 2048 < paired


def test_cover_holds_every_pair_of_a_toy_design():
    parameters = {"a": ("0", "1", "2"), "b": ("0", "1", "2"), "c": ("0", "1"), "d": ("0", "1")}

    def build(row):  # a constraint: a=2 cannot meet c=1
        return None if row.get("a") == "2" and row.get("c") == "1" else row

    def held(row):
        return {tuple(sorted(pair)) for pair in itertools.combinations(row.items(), 2)}

    items = sorted((name, value) for name, values in parameters.items() for value in values)
    pairs = [(x, y) for i, x in enumerate(items) for y in items[i + 1:] if x[0] != y[0] and build(dict((x, y)))]
    rows = covering.cover(parameters, build, held, pairs)
    assert all(build(row) is not None for row in rows)
    assert set(pairs) <= set().union(*(held(row) for row in rows))
    assert 9 <= len(rows) <= 11  # 3 x 3 pairs of a and b at least; greedy stays near it
    assert rows == covering.cover(parameters, build, held, pairs)  # deterministic
