"""What the compile passes do about differences between torch 2.11 and 2.15 (docs/PASSES.md, "torch
versions"), checked on whichever torch runs the tests: the graph forms of every release are built
by hand, so torch 2.13's test command checks the 2.15 form too. The releases themselves run in
the nightly torch legs (docs/VERSIONS.md)."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch._inductor.pattern_matcher as pm

import mla_fuse.compile as mc
from mla_fuse.layers import unified_ops  # noqa: F401  (registers mla_fuse::rotary_embedding)
from mla_fuse.passes import pattern_utils
from mla_fuse.passes.scatter_split_replace import ScatterSplitReplacementPass

aten = torch.ops.aten
END = 9223372036854775807  # how functionalization writes an open slice end


def _rope_slices_graph(reads):
    """A packed qkv rotated in place, as torch 2.15's functionalization writes it: the write-backs,
    then ``slice``s of the scattered buffer instead of a re-split. ``reads``: ``(start, end)`` pairs."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(qkv, positions, table):
        q, k, _ = aten.split_with_sizes.default(qkv, [8, 8, 8], -1)
        rope = auto_functionalized(torch.ops.mla_fuse.rotary_embedding.default, positions=positions, query=q,
                                   key=k, head_size=8, cos_sin_cache=table, is_neox=True)
        s1 = aten.slice_scatter.default(qkv, rope[1], 1, 0, 8)
        s2 = aten.slice_scatter.default(s1, rope[2], 1, 8, 16)
        return tuple(aten.slice.Tensor(s2, -1, start, end) * (i + 1) for i, (start, end) in enumerate(reads))
    return make_fx(fn)(torch.randn(3, 24), torch.arange(3), torch.randn(16, 8))


@pytest.mark.parametrize("reads, rewritten", [
    (((0, 8), (8, 16), (16, END), (0, 8)), True),   # q twice, k, v with an open end: torch 2.15's decoder
    (((8, 16),), True),                               # k alone (MLA's k_pe of [kv_c | k_pe])
    (((0, 8), (8, 9)), False),                        # a column of k: a reader of the scattered values
    (((0, 16),), False),                              # q and k together: not one part
], ids=["every-part", "one-part", "a-column", "two-parts"])
def test_scatter_split_replacement_reads_torch_215_slices_of_one_part(reads, rewritten):
    gm = _rope_slices_graph(reads)
    args = torch.randn(3, 24), torch.arange(3), torch.randn(16, 8)
    expected = gm(*args)
    graph_pass = ScatterSplitReplacementPass()
    graph_pass(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    scatters = gm.graph.find_nodes(op="call_function", target=aten.slice_scatter.default)
    assert graph_pass.matched_count == int(rewritten)
    assert len(scatters) == (0 if rewritten else 2)
    for result, want in zip(gm(*args), expected):
        torch.testing.assert_close(result, want, rtol=0, atol=0)


def test_pattern_name_is_passed_only_where_register_replacement_takes_it():
    """torch 2.11/2.12: ``register_replacement()`` has no ``pattern_name`` (a TypeError inside Inductor)."""
    accepted = set(inspect.signature(pm.register_replacement).parameters)
    options = pattern_utils._pattern_name_option("mla_rope_kvcache")
    assert set(options) <= accepted
    assert options == ({"pattern_name": "mla_rope_kvcache"} if "pattern_name" in accepted else {})


def test_torch_release_reads_local_builds():
    assert mc.torch_release("2.11.0+cu130") == (2, 11)
    assert mc.torch_release("2.15.0") == (2, 15)
    assert mc.torch_release("2.13.0+cpu") == (2, 13)


def test_one_warning_on_a_torch_whose_inductor_drops_roundings():
    """torch 2.11/2.12: one ``TorchVersionWarning`` per process, naming the version; none from 2.13 on."""
    mc.warn_for_this_torch.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mc.MlaFuseBackend()
        mc.MlaFuseBackend()
    ours = [w for w in caught if issubclass(w.category, mc.TorchVersionWarning)]
    if mc.torch_release() < mc.ROUNDING_KEPT_SINCE:
        assert len(ours) == 1 and torch.__version__ in str(ours[0].message)
    else:
        assert not ours
