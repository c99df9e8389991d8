"""Deliberately broken compile passes, one or more per "Compile passes" class of docs/BUGS.md.

Each ``PassMutant`` is a context manager that patches one thing in ``mla_fuse.passes`` (or, for
the copy-free rule, in how a layer hands its cache to the graph: ``cache_arguments``) while active,
and drops the process-wide cache of traced patterns on the way in and out (a patched pattern
class must be traced again). ``tests/test_pass_mutants.py`` runs the compile-pass property
suite alone against each and requires a failure: an ``AssertionError`` from a property, or one
of the error types the mutant lists in ``caught_by`` (a mutant whose bug breaks the graph
itself, e.g. a replacement placed before its inputs, is caught by the graph lint as a
``RuntimeError``). A mutant whose bug shows only in a graph no model produces names the unit test
that builds such a graph (``unit_test``), and the self-test runs that test instead of the property.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator
from unittest import mock

import torch
from torch._inductor.fx_passes.post_grad import view_to_reshape

import mla_fuse.compile as mc  # not `compile`: Python's builtin
from mla_fuse.layers import unified_ops
from mla_fuse.layers.mha import MHAAttention
from mla_fuse.layers.mla import MLAAttention
from mla_fuse.passes import (
    aliasing, config, defunctionalize, mla_rope_kvcache_fusion, pattern_utils, rope_forms,
    rope_kvcache_fusion, scatter_split_replace, split_coalescing,
)
from mla_fuse.passes.fx_utils import call_args, is_op
from mla_fuse_conformance.compile_passes.cache_arguments import (
    mha_attend_with_cache_arguments, mla_attend_with_cache_arguments,
)
from mla_fuse_conformance.compile_passes.layers import inverse_rope

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class PassMutant:
    name: str
    bug_class: str                      # the BUGS.md line it carries
    patch: Callable[[], contextlib.AbstractContextManager]
    caught_by: tuple[type[BaseException], ...] = (AssertionError,)
    # A bug in a graph shape no model produces (docs/PASSES.md, "Situations and graph shapes"), which the
    # property cannot see: the unit test of tests/ that catches it instead (``module:test``).
    unit_test: str | None = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        pattern_utils.clear_pattern_cache()
        try:
            with self.patch():
                yield
        finally:
            pattern_utils.clear_pattern_cache()


def _patches(*patches) -> Callable[[], contextlib.AbstractContextManager]:
    def enter():
        stack = contextlib.ExitStack()
        for target, attribute, value in patches:
            stack.enter_context(mock.patch.object(target, attribute, value))
        return stack
    return enter


# ------------------------------------------------------------------ matching too broadly / not at all


_PRESENT = rope_forms.present


def _present_with_inverse(graph):
    return _PRESENT(graph) + ([("inverse", False)] if pattern_utils.table_lookups(graph) else [])


def _too_broad():
    """The inverse rotation registered as a rope form, replaced by the (forward) fused op."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict(rope_forms.FORMS, {"inverse": inverse_rope}))
    stack.enter_context(mock.patch.object(rope_forms, "present", _present_with_inverse))
    return stack


def _report_without_rewriting(self, graph):
    if not self.enabled():
        return 0
    self._register_for(graph, self.fusable_updates(graph))
    return sum(self.fusable(call_args(node)["kv_cache_dtype"])
               for node in graph.find_nodes(op="call_function", target=self.update_op))


# ------------------------------------------------------------------ rewrites gone wrong


def _drop_q_write_back(self):
    """The q_pe write-back into q is deleted, but the fused node stays functional (writes a copy)."""
    for items in self.new_value.values():
        for item in items:
            _drop_scatters(self.graph, item)


def _drop_scatters(graph, node):
    for user in list(node.users):
        if is_op(user, aten.copy.default):
            _drop_scatters(graph, user)
        elif is_op(user, aten.slice_scatter.default) and user.args[1] is node:
            user.replace_all_uses_with(user.args[0])
            graph.erase_node(user)


def _drop_every_scatter_of_the_new_value(self, new_value, arg):
    """``_drop_write_backs`` taking every ``slice_scatter`` of the new value for a write-back over ``arg``
    (no ``aliasing.is_write_back``): a scatter into another buffer is dropped too, and its readers read
    that buffer as it was before the scatter."""
    for user in list(new_value.users):
        if aliasing.same_shape_reshape(user) or (
                is_op(user, aten.copy.default) and user.meta["val"].shape == new_value.meta["val"].shape
                and user.args[1] is new_value):
            _drop_every_scatter_of_the_new_value(self, user, arg)
            user.replace_all_uses_with(new_value)
            self.graph.erase_node(user)
        elif is_op(user, aten.slice_scatter.default) and user.args[1] is new_value:
            user.replace_all_uses_with(user.args[0])
            self.graph.erase_node(user)


def _graph_start(self):
    """The in-place call goes before the first computation: before its inputs exist."""
    return next(node for node in self.graph.nodes if node.op != "placeholder")


_MHA_REPLACEMENT = rope_kvcache_fusion.RopeKVCacheFusionPattern.replacement


def _swapped_outputs(self, *args):
    q_new, dummy, k_new = _MHA_REPLACEMENT(self, *args)
    return k_new, dummy, q_new


def _first_layer_of_its_kind(replacement):
    """The replacement names the first layer its pass saw (of the same kind) instead of its own
    (``layer_name``, bound by the match, is the replacement's last argument)."""
    first: dict[type, str] = {}

    def wrapped(self, *args):
        *tensors, own = args
        return replacement(self, *tensors, first.setdefault(type(self), own))
    return wrapped


def _scatter_deleted_under_its_readers(scattered):
    """The scatter chain goes although other nodes read it: they are pointed at the buffer as it was
    before the scatters (the pre-rotation values)."""
    resplit = next((user for user in scattered.users if is_op(user, scatter_split_replace.SPLIT)), None)
    base = scattered
    while is_op(base, scatter_split_replace.SLICE_SCATTER):
        base = base.args[0]
    for user in list(scattered.users):
        if user is not resplit:
            user.replace_input_with(scattered, base)
    return resplit


def _resplit_among_other_splits(scattered):
    """Other splits of the scattered buffer (other sizes) are taken for duplicates of its re-split, and the
    scatter chain is dropped under them: they are pointed at the buffer as it was before the scatters."""
    splits = [user for user in scattered.users if is_op(user, scatter_split_replace.SPLIT)]
    if not splits or len(splits) != len(scattered.users):
        return None
    base = scattered
    while is_op(base, scatter_split_replace.SLICE_SCATTER):
        base = base.args[0]
    for other in splits[1:]:
        other.replace_input_with(scattered, base)
    return splits[0]


_REWRITE_SPLIT = scatter_split_replace.ScatterSplitReplacementPattern._rewrite_split


def _chain_read_between_its_links(self, split, new_parts):
    """The scatter chain walked without its check on a link before the last: a reader of such a link (the
    buffer with q written back, k not yet) is pointed at the buffer as it was before that link, and the
    chain goes."""
    buf = current = split.args[0]
    for _ in new_parts:
        links = [u for u in current.users if is_op(u, scatter_split_replace.SLICE_SCATTER) and u.args[0] is current]
        if len(links) != 1:
            break
        if current is not buf:
            for user in [u for u in current.users if u is not links[0]]:
                user.replace_input_with(current, current.args[0])
        current = links[0]
    return _REWRITE_SPLIT(self, split, new_parts)


_SPLIT_KEY = split_coalescing.SplitCoalescingPattern.key


def _split_key_without_dim(split):
    """vLLM's SplitCoalescingPass bug (vllm-project/vllm#57299): splits keyed by tensor and sizes only, so
    two splits of one tensor along different dims are merged into the first."""
    source, sizes, _ = _SPLIT_KEY(split)
    return source, sizes


def _no_foreign_readers(*args, **kwargs):
    return []


# ------------------------------------------------------------------ ops that misdeclare themselves


_PRODUCT_MLA_FUSED = unified_ops.fused_rope_and_unified_mla_kv_cache_update._init_fn  # the function behind the op

# The product's fused MLA op under other names: one whose fake disagrees with it, one whose schema
# does not declare that it writes q_pe.
_bad_fake_op = torch.library.custom_op("mla_fuse_bad_fake::fused_rope_and_unified_mla_kv_cache_update",
                                       _PRODUCT_MLA_FUSED, mutates_args=("q_pe", "k_pe"))
_omits_q_pe_op = torch.library.custom_op("mla_fuse_undeclared::fused_rope_and_unified_mla_kv_cache_update",
                                         _PRODUCT_MLA_FUSED, mutates_args=("k_pe",))


@_bad_fake_op.register_fake
def _(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, layer_name, kv_cache_dtype, k_scale):
    return q_pe.new_empty(q_pe.size(0), 1)  # the real op returns an empty tensor of kv_c's dtype


@_omits_q_pe_op.register_fake
def _(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, layer_name, kv_cache_dtype, k_scale):
    return kv_c.new_empty(0)


def _replacement_trusting_an_undeclared_write(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, k_scale, layer_name):
    """The op rotates q_pe in place without declaring it; the replacement takes q_pe as the result."""
    fused = torch.ops.higher_order.auto_functionalized(
        _omits_q_pe_op._opoverload, positions=positions, q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=cos_sin_cache,
        is_neox=self.is_neox, layer_name=layer_name, kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale)
    return q_pe, fused[0], fused[1]


def _inserting(op):
    return _patches((mla_rope_kvcache_fusion, "FUSED_MLA_UPDATE", op),
                    (defunctionalize, "FUSED_OPS", (op, unified_ops.FUSED_UPDATE)))


def _test_backend_form(gm):
    """The form the patterns had before: views as reshapes, none of Inductor's joint-graph rewrites."""
    view_to_reshape(gm)


# ------------------------------------------------------------------ statistics


def _counts_from_the_last_run(self, delta, storages):
    """The pre-fix statistics: what the passes counted when they ran (nothing on a cache hit)."""
    ran = self.pass_manager.last_graph is not None
    counts = self.pass_manager.last_match_counts() if ran else dict.fromkeys(self.pass_manager.pass_names(), 0)
    self.records.append(mc.GraphRecord(counts, delta.get(mc.FX_CACHE_HIT_COUNTER, 0) > 0,
                                       self.pass_manager.last_graph, storages))


def _enabled_from_o1(self, flag, update_op):
    """The level check off by one: the fusions run at O1 (split points and flags still honoured)."""
    if self.level == 0 or config._is_split_point(update_op, self.splitting_ops):
        return False
    return True if flag is None else flag


# ------------------------------------------------------------------ the mutants

_LAZY = pattern_utils.LazyPatternFusionPass
_MLA_PATTERN = mla_rope_kvcache_fusion.MLARopeKVCacheFusionPattern
_MHA_PATTERN = rope_kvcache_fusion.RopeKVCacheFusionPattern

PASS_MUTANTS = {m.name: m for m in [
    PassMutant("matches_an_unsupported_rope", "A pass matching too broadly (a different rope form) and silently "
               "changing numbers", _too_broad),
    PassMutant("reports_success_without_rewriting", "not matching at all while reporting success",
               _patches((_LAZY, "run", _report_without_rewriting))),
    PassMutant("drops_the_q_write_back", "The write-back of q_pe into q lost after fusion",
               _patches((defunctionalize.DefunctionalizationPattern, "rewrite", _drop_q_write_back))),
    PassMutant("ignores_pre_rotation_readers", "An op after the fused op reading the pre-mutation value",
               _patches((aliasing, "foreign_readers", _no_foreign_readers),
                        (pattern_utils, "foreign_readers", _no_foreign_readers))),
    PassMutant("replacement_before_its_inputs", "Replacement inserted before its inputs exist",
               _patches((defunctionalize.DefunctionalizationPattern, "insertion_point", _graph_start)),
               caught_by=(AssertionError, RuntimeError)),
    PassMutant("swaps_q_and_k_outputs", "multi-output rewiring wrong",
               _patches((_MHA_PATTERN, "replacement", _swapped_outputs)), caught_by=(AssertionError, RuntimeError)),
    PassMutant("deletes_a_scatter_with_other_readers", "an intermediate with other users deleted",
               _patches((scatter_split_replace.ScatterSplitReplacementPattern, "sole_resplit",
                         staticmethod(_scatter_deleted_under_its_readers)))),
    PassMutant("drops_a_scatter_into_another_buffer", "an intermediate with other users deleted (a scatter of "
               "the rotated k into a buffer another op reads, taken for k's write-back)",
               _patches((defunctionalize.DefunctionalizationPattern, "_drop_write_backs",
                         _drop_every_scatter_of_the_new_value))),
    PassMutant("drops_a_scatter_read_by_another_split", "an intermediate with other users deleted (a second "
               "split of the scattered buffer)",
               _patches((scatter_split_replace.ScatterSplitReplacementPattern, "sole_resplit",
                         staticmethod(_resplit_among_other_splits)))),
    PassMutant("drops_a_scatter_link_with_other_readers", "an intermediate with other users deleted (a link of "
               "the scatter chain before the last, read by another op)",
               _patches((scatter_split_replace.ScatterSplitReplacementPattern, "_rewrite_split",
                         _chain_read_between_its_links)),
               unit_test="test_passes_unit:test_scatter_split_replacement_keeps_a_scatter_with_other_users"),
    PassMutant("merges_splits_along_different_dims", "Duplicate splits merged although they split along "
               "different dims", _patches((split_coalescing.SplitCoalescingPattern, "key",
                                           staticmethod(_split_key_without_dim)))),
    PassMutant("writes_layer_0s_cache", "one layer's cache used for another",
               _patches((_MLA_PATTERN, "replacement", _first_layer_of_its_kind(_MLA_PATTERN.replacement)),
                        (_MHA_PATTERN, "replacement", _first_layer_of_its_kind(_MHA_PATTERN.replacement)))),
    PassMutant("fake_disagrees_with_the_op", "Fake (meta) output metadata differing from the real op's",
               _inserting(_bad_fake_op._opoverload)),
    PassMutant("schema_omits_a_written_q_pe", "a fused op writing a tensor its schema does not declare",
               _patches((_MLA_PATTERN, "replacement", _replacement_trusting_an_undeclared_write),
                        (defunctionalize, "FUSED_OPS", (_omits_q_pe_op._opoverload, unified_ops.FUSED_UPDATE)))),
    PassMutant("fuses_at_o1", "Fusion active where it must be off (O1)",
               _patches((config.FusionConfig, "_fusion_enabled", _enabled_from_o1))),
    PassMutant("fuses_a_split_point", "Fusion active where it must be off (split graph)",
               _patches((config, "_is_split_point", lambda op_name, splitting_ops: False))),
    PassMutant("fuses_any_cache_format", "Fusion active where it must be off (unsupported cache format)",
               _patches((_LAZY, "fusable", lambda self, kv_cache_dtype: True))),
    PassMutant("static_shapes_only", "Fusion that only fires with static shapes",
               _patches((pattern_utils, "unify_symbolic_sizes", lambda graph: 0))),
    PassMutant("patterns_in_the_test_backends_form", "only on the test backend and not on Inductor (patterns "
               "traced without Inductor's canonical form)",
               _patches((pattern_utils, "canonicalize", _test_backend_form))),
    PassMutant("binds_q_on_ks_chain", "Two pattern inputs bound to the same node",
               _patches((pattern_utils, "inputs_distinct", lambda match, names: True),
                        (pattern_utils, "binding_is_sound", lambda match, ranks, widths: True)),
               caught_by=(AssertionError, ValueError)),
    # (On a hybrid stack over one interleaved pool this design does not even compile: Inductor's
    # decompose_auto_functionalized fails its own assertion, on both backends.)
    PassMutant("caches_enter_the_graph", "A cache copied by functionalization because caches alias",
               _patches((MLAAttention, "update_and_attend", mla_attend_with_cache_arguments),
                        (MHAAttention, "update_and_attend", mha_attend_with_cache_arguments)),
               caught_by=(AssertionError, torch._dynamo.exc.BackendCompilerFailed)),
    PassMutant("counts_lost_on_a_cache_hit", "Pass statistics that read 0 when the compiled graph came from a cache",
               _patches((mc.MlaFuseBackend, "_record", _counts_from_the_last_run))),
]}
