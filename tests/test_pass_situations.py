"""Every situation and graph shape the compile passes handle is among the compile-pass property's
explicit examples, which every profile runs (docs/PASSES.md, "Situations and graph shapes"): random
drawing does not guarantee them within a profile's budget."""

from __future__ import annotations

import torch

from mla_fuse_conformance.compile_passes.checks import Run
from mla_fuse_conformance.compile_passes.layers import LAYER_CLASSES, ROPE_FORMS
from mla_fuse_conformance.properties.test_compile_passes import EXPLICIT
import mla_fuse.compile as mc

SPLIT = torch.ops.aten.split_with_sizes.default
SLICE_SCATTER = torch.ops.aten.slice_scatter.default


def _explicit_with(kind: str, situation: str):
    return [case for case in EXPLICIT if (kind, situation) in zip(case.model.kinds, case.model.situations)]


def test_every_layer_kind_in_every_situation_is_an_explicit_example():
    missing = [pair for pair in LAYER_CLASSES if not _explicit_with(*pair)]
    assert not missing, f"no explicit compile-pass example has a layer of (kind, situation) {missing}"


def test_explicit_examples_cover_each_rope_form_style_backend_and_token_count():
    seen = {(name, value) for case in EXPLICIT for name, value in (
        ("rope", case.model.rope), ("is_neox", case.model.is_neox), ("backend", case.backend),
        ("dynamic", case.dynamic))}
    wanted = {("rope", form) for form in ROPE_FORMS} | {("is_neox", True), ("is_neox", False)} | {
        ("backend", "light"), ("backend", "inductor"), ("dynamic", True), ("dynamic", False)}
    assert wanted <= seen, f"not in the explicit examples: {sorted(wanted - seen)}"


def _post_pass_graph(case) -> tuple[dict[str, int], torch.fx.Graph]:
    run = Run(case)
    run.step()
    record = mc.graph_records(run.compiled)[-1]
    return record.counts, record.graph


def _split_dims(graph: torch.fx.Graph) -> dict[tuple, set[int]]:
    """Per (split tensor, sizes): the dims it is split along in ``graph``."""
    dims: dict[tuple, set[int]] = {}
    for split in graph.find_nodes(op="call_function", target=SPLIT):
        dim = split.args[2] if len(split.args) > 2 else 0
        dims.setdefault((split.args[0], tuple(split.args[1])), set()).add(dim % split.args[0].meta["val"].dim())
    return dims


def test_the_split_example_has_duplicate_splits_along_one_dim_and_splits_along_two():
    (case,) = [c for c in _explicit_with("mha", "splits_along_two_dims") if c.model.rope == "custom_op"]
    counts, graph = _post_pass_graph(case)
    assert counts["split_coalescing"] > 0, counts  # functionalization's re-splits of qkv, merged
    assert sum(len(dims) == 2 for dims in _split_dims(graph).values()) == len(case.model.kinds), str(graph)


def test_the_split_reader_example_keeps_a_scattered_buffer_with_a_second_split():
    (case,) = [c for c in _explicit_with("mha", "second_split_reader") if c.model.rope == "custom_op"]
    counts, graph = _post_pass_graph(case)
    split_readers = [scatter for scatter in graph.find_nodes(op="call_function", target=SLICE_SCATTER)
                     if sum(user.target is SPLIT for user in scatter.users) >= 2]
    assert counts["scatter_split_replacement"] == 0 and len(split_readers) == len(case.model.kinds), str(graph)
