"""RopeKVCacheFusionPass (MHA): rotary_embedding + unified_kv_cache_update -> one fused op (CONTRACT §6)."""

from __future__ import annotations

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized

from mla_fuse.layers import mha, rotary_embedding, unified_ops
from mla_fuse.passes import aliasing, pattern_utils, rope_forms
from mla_fuse.passes.fx_utils import call_args, find_auto_functionalized

UNIFIED_UPDATE = unified_ops.UNIFIED_UPDATE
FUSED_UPDATE = unified_ops.FUSED_UPDATE


class RopeKVCacheFusionPattern:
    """One rope form, one style, one cache format and geometry, every layer. Matched graph (``rope`` = the
    form's subgraph; q ``[T, H*D]``, k ``[T, Hkv*D]``, value ``[T, Hkv, Dv]``; ``heads`` = ``mha.heads``;
    ``NAME`` a wildcard bound by the match, passed to the replacement)::

        q_rot, k_rot = rope(positions, q, k, cos_sin_cache, head_size=D, is_neox)
        dummy = unified_kv_cache_update(heads(k_rot, Hkv, D), value, NAME[, DTYPE])
        outputs: q_rot (the anchor), dummy, k_rot; native forms: heads(q_rot, H, D), dummy, heads(k_rot, Hkv, D)

    Replacement::

        f = auto_functionalized(fused_rope_and_unified_kv_cache_update, query=q, key=k, value=value,
                                positions=positions, cos_sin_cache=cos_sin_cache, is_neox=is_neox,
                                layer_name=NAME, kv_cache_dtype=DTYPE)
        outputs: f[1] (q rotated), f[0] (dummy), f[2] (k rotated); native forms: their heads views

    Why the native forms' outputs are heads views: a native rope rotates ``[T, heads, D]`` views and
    returns them flattened, the layer views the results as heads again (``mha.heads``, for the
    attention and the update), and Inductor folds the view pair away; so in a decoder, where nothing
    else reads the rotated q and k, the flattened tensors are no nodes of the graph, and a pattern
    with them as outputs matched only models that return them (the tests' did). The heads views are
    nodes in a decoder; where the model also reads the flattened tensors, Inductor may keep them
    instead (seen with the GPT-J form), so native forms register both (``outputs``: ``heads``
    first, then ``flat``). The custom op's outputs are the flattened tensors themselves.

    Run after ``ScatterSplitReplacementPass`` (which makes ``k_rot`` feed the update directly).
    Anchored at the rotated q and checked like the MLA pattern (``binding_is_sound``: distinct
    q/k/value of ranks 2/2/3, no cycle); refused when the pre-rotation q/k (or the packed qkv
    they view) have readers outside the pattern. The update is called as the graph calls it
    (``CallForm``): with ``DTYPE``, or vLLM's way ``(key, value, layer_name)`` (then ``DTYPE`` is None).
    """

    EXAMPLE_TOKENS, EXAMPLE_HEADS, EXAMPLE_POSITIONS = 5, 2, 64

    def __init__(self, form: str, is_neox: bool, call_form: pattern_utils.CallForm, kv_cache_dtype: str | None,
                 act_dtype: torch.dtype, table_dtype: torch.dtype, kv_heads: int, head_size: int,
                 value_head_size: int, rotary_dim: int, outputs: str = "flat") -> None:
        self.form, self.rope = form, rope_forms.FORMS[form]
        self.outputs = outputs  # "flat": the rope's results; "heads": their heads views (native forms)
        self.call_form = call_form
        self.is_neox = is_neox
        self.kv_cache_dtype = kv_cache_dtype
        self.act_dtype, self.table_dtype = act_dtype, table_dtype
        self.kv_heads, self.head_size, self.value_head_size, self.rotary_dim = (
            kv_heads, head_size, value_head_size, rotary_dim)

    def example_inputs(self) -> list[torch.Tensor]:
        T, H, Hkv, D = self.EXAMPLE_TOKENS, self.EXAMPLE_HEADS, self.kv_heads, self.head_size
        return [
            torch.empty(T, dtype=torch.int64),                                              # positions
            torch.empty(T, H * D, dtype=self.act_dtype),                                    # q
            torch.empty(T, Hkv * D, dtype=self.act_dtype),                                  # k
            torch.empty(T, Hkv, self.value_head_size, dtype=self.act_dtype),                # value
            torch.empty(self.EXAMPLE_POSITIONS, self.rotary_dim, dtype=self.table_dtype),  # cos_sin_cache
        ]

    def pattern(self, positions, q, k, value, cos_sin_cache, layer_name):
        q_rot, k_rot = self.rope(positions, q, k, cos_sin_cache, self.head_size, self.rotary_dim, self.is_neox)
        k_heads = mha.heads(k_rot, self.kv_heads, self.head_size)
        dummy = self.call_form.call(UNIFIED_UPDATE, key=k_heads, value=value, layer_name=layer_name,
                                    kv_cache_dtype=self.kv_cache_dtype)
        if self.outputs == "flat":
            return q_rot, dummy, k_rot
        return mha.heads(q_rot, q.size(-1) // self.head_size, self.head_size), dummy, k_heads

    def replacement(self, positions, q, k, value, cos_sin_cache, layer_name):
        fused = auto_functionalized(
            FUSED_UPDATE, query=q, key=k, value=value, positions=positions, cos_sin_cache=cos_sin_cache,
            is_neox=self.is_neox, layer_name=layer_name, kv_cache_dtype=self.kv_cache_dtype,
        )
        if self.outputs == "flat":
            return fused[1], fused[0], fused[2]
        return (mha.heads(fused[1], q.size(-1) // self.head_size, self.head_size), fused[0],
                mha.heads(fused[2], self.kv_heads, self.head_size))

    @property
    def name(self) -> str:
        return f"rope_kvcache[{self.form},{self.is_neox},{self.kv_cache_dtype},{self.outputs}]"

    def precheck(self, match: pm.Match) -> bool:
        return pattern_utils.inputs_distinct(match, ("q", "k", "value"))

    def extra_check(self, match: pm.Match) -> bool:
        ranks = {"q": 2, "k": 2, "value": 3}
        widths = {"value": self.value_head_size}
        return (pattern_utils.binding_is_sound(match, ranks, widths)
                and pattern_utils.no_foreign_readers(match, ("q", "k")))


class RopeKVCacheFusionPass(pattern_utils.LazyPatternFusionPass):
    """Registers ``RopeKVCacheFusionPattern``s for the forms of the MHA cache updates it finds (one set for all
    layers of one shape), then applies them."""

    name = "rope_kvcache_fusion"
    update_op = UNIFIED_UPDATE

    def enabled(self) -> bool:
        return self.config.rope_kvcache_enabled

    def _rotary_dims(self, graph: fx.Graph) -> set[int]:
        """Table widths of the graph's ropes: the custom op's table, a native rope's indexed table."""
        hint = pattern_utils.hint
        dims = {hint(node.kwargs["cos_sin_cache"].meta["val"].size(-1))
                for node in find_auto_functionalized(graph, torch.ops.mla_fuse.rotary_embedding.default)}
        return dims | {hint(node.args[0].meta["val"].size(-1)) for node in pattern_utils.table_lookups(graph)}

    def _register_for(self, graph: fx.Graph, updates: list[fx.Node]) -> None:
        hint = pattern_utils.hint
        rotary_dims, forms = self._rotary_dims(graph), rope_forms.present(graph)
        table_dtypes = sorted(pattern_utils.table_dtypes(graph), key=str)
        configs = set()
        for update in updates:
            args = call_args(update)
            key, value = args["key"].meta["val"], args["value"].meta["val"]
            if key.dim() != 3 or value.dim() != 3:
                continue  # the pattern reaches the update through heads(k_rot): [T, Hkv, D]
            kv_heads, head_size = hint(key.size(1)), hint(key.size(2))
            configs |= {(pattern_utils.CallForm.of(update), args["kv_cache_dtype"], key.dtype, table_dtype, kv_heads,
                         head_size, hint(value.size(-1)), rotary_dim)
                        for rotary_dim in rotary_dims if rotary_dim <= head_size for table_dtype in table_dtypes}
        for config in sorted(configs, key=repr):
            for form, is_neox in forms:
                for outputs in ("flat",) if form == "custom_op" else ("heads", "flat"):
                    self.register(RopeKVCacheFusionPattern(form, is_neox, *config, outputs),
                                  (form, is_neox, *config, outputs))

    def uuid_sources(self):
        return (*super().uuid_sources(), pattern_utils, rope_forms, aliasing, rotary_embedding, mha, unified_ops,
                repr(self.config))
