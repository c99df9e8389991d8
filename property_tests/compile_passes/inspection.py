"""What the compile-pass tests check: the ops and kernels a compiled graph should or should not call,
bitwise comparisons of results and caches, graph inspection (calls of an op, slice_scatters, native
rope nodes, the layer of a node, the final graph) and counts of the kernel calls a run makes.
"""

from __future__ import annotations

import collections
import contextlib

import torch

from mla_fuse import ops
from mla_fuse.layers import unified_ops
from mla_fuse.passes.fx_utils import call_args
from mla_fuse_conformance.cases.engine_caches import EngineCaches, pools_bitwise_equal

FUSED_MLA = unified_ops.FUSED_MLA_UPDATE
UNIFIED_MLA = unified_ops.UNIFIED_MLA_UPDATE
FUSED_MHA = unified_ops.FUSED_UPDATE
UNIFIED_MHA = unified_ops.UNIFIED_UPDATE
ROTARY = torch.ops.mla_fuse.rotary_embedding.default
SLICE_SCATTER = torch.ops.aten.slice_scatter.default
ATTENTION = {"mla": torch.ops.mla_fuse.unified_mla_attention.default,
             "mha": torch.ops.mla_fuse.unified_attention.default}
FUSED_OP = {"mla": FUSED_MLA, "mha": FUSED_MHA}
UNIFIED_OP = {"mla": UNIFIED_MLA, "mha": UNIFIED_MHA}
PASS_NAME = {"mla": "mla_rope_kvcache_fusion", "mha": "rope_kvcache_fusion"}
FUSED_KERNEL = {"mla": "concat_and_cache_mla_rope_fused", "mha": "rope_and_reshape_and_cache_flash"}
CACHE_KERNEL = {"mla": "concat_and_cache_mla", "mha": "reshape_and_cache_flash"}


# ------------------------------------------------------------------ comparisons


def bitwise_differences(actual: torch.Tensor, expected: torch.Tensor, what: str) -> list[str]:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return [f"{what}: {tuple(actual.shape)} {actual.dtype} != {tuple(expected.shape)} {expected.dtype}"]
    a, e = actual.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    if torch.equal(a, e):
        return []
    return [f"{what}: {int((a != e).sum())} bytes differ"]


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    problems = bitwise_differences(actual, expected, what)
    assert not problems, problems[0]


def result_differences(result, expected) -> list[str]:
    """Output and every layer's rotated q and k, bit for bit."""
    problems = bitwise_differences(result[0], expected[0], "model output")
    for i, (a, e) in enumerate(zip(result[1], expected[1])):
        problems += bitwise_differences(a, e, f"layer {i // 2} {'q' if i % 2 == 0 else 'k'} after rope")
    return problems


# ------------------------------------------------------------------ graph inspection


def count_calls(graph: torch.fx.Graph, op) -> int:
    """Nodes calling ``op`` directly or through ``auto_functionalized``."""
    return sum(1 for n in graph.nodes if n.op == "call_function" and (
        n.target is op or (n.target is torch.ops.higher_order.auto_functionalized and n.args[0] is op)))


def count_slice_scatters(graph: torch.fx.Graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target is SLICE_SCATTER)


def native_rope_nodes(graph: torch.fx.Graph) -> int:
    """``index`` of a cos/sin table: the first op of a native rope."""
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target in (
        torch.ops.aten.index.Tensor, torch.ops.aten.index_select.default))


def layer_of(node: torch.fx.Node) -> str:
    """The ``layer_name`` argument of one of our ops' calls."""
    if node.target is torch.ops.higher_order.auto_functionalized:
        return node.kwargs["layer_name"]
    return call_args(node)["layer_name"]


def final_graph(compiled) -> torch.fx.Graph:
    return compiled.mla_fuse_backend.graphs[-1]


@contextlib.contextmanager
def counting_kernel_calls():
    """Counts calls of the public ``mla_fuse.ops`` wrappers the unified/fused ops dispatch to."""
    counts: collections.Counter = collections.Counter()
    names = ("rotary_embedding", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
             "reshape_and_cache_flash", "rope_and_reshape_and_cache_flash")
    originals = {name: getattr(ops, name) for name in names}

    def wrap(name):
        def counted(*args, **kwargs):
            counts[name] += 1
            return originals[name](*args, **kwargs)
        return counted

    for name in names:
        setattr(ops, name, wrap(name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(ops, name, fn)



def assert_same_results(result, expected, caches: EngineCaches, expected_caches: EngineCaches) -> None:
    """Output, every layer's q and k and every byte of every cache pool, bit for bit."""
    problems = result_differences(result, expected) + pools_bitwise_equal(caches, expected_caches)
    assert not problems, "\n".join(problems)

