"""RopeKVCacheFusionPass (MHA): rotary_embedding + unified_kv_cache_update -> one fused op (CONTRACT §6)."""

from __future__ import annotations

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized

from mla_fuse.layers import rotary_embedding, unified_ops
from mla_fuse.passes import aliasing, pattern_utils, rope_forms
from mla_fuse.passes.fx_utils import find_auto_functionalized

UNIFIED_UPDATE = unified_ops.UNIFIED_UPDATE
FUSED_UPDATE = unified_ops.FUSED_UPDATE


class RopeKVCacheFusionPattern:
    """One layer, one rope form, one style. Matched graph (``rope`` = the form's subgraph;
    q ``[T, H*D]``, k ``[T, Hkv*D]``, v ``[T, Hkv*Dv]``, D = ``key_cache.size(-1)``)::

        q_rot, k_rot = rope(positions, q, k, cos_sin_cache, head_size=D, is_neox)
        upd = auto_functionalized(unified_kv_cache_update, k=k_rot, v=v, key_cache=key_cache,
                                  value_cache=value_cache, layer_name=NAME, kv_cache_dtype=DTYPE,
                                  k_scale=k_scale, v_scale=v_scale)
        outputs: upd[0] (dummy), upd[1], upd[2] (new caches), q_rot, k_rot

    Replacement::

        f = auto_functionalized(fused_rope_and_unified_kv_cache_update, q=q, k=k, v=v,
                                key_cache=key_cache, value_cache=value_cache, positions=positions,
                                cos_sin_cache=cos_sin_cache, is_neox=is_neox, layer_name=NAME,
                                kv_cache_dtype=DTYPE, k_scale=k_scale, v_scale=v_scale)
        outputs: f[0], f[3], f[4], f[1], f[2]

    Run after ``ScatterSplitReplacementPass`` (which makes ``k_rot`` feed the update directly).
    Refused when the pre-rotation q/k (or the packed qkv they view) have readers outside the
    pattern, or a cache's innermost stride is not 1.
    """

    EXAMPLE_TOKENS, EXAMPLE_HEADS, EXAMPLE_KV_HEADS, EXAMPLE_BLOCKS, EXAMPLE_POSITIONS = 5, 2, 1, 4, 64

    def __init__(self, form: str, is_neox: bool, layer_name: str, kv_cache_dtype: str, act_dtype: torch.dtype,
                 cache_dtype: torch.dtype, table_dtype: torch.dtype, head_size: int, value_head_size: int,
                 rotary_dim: int) -> None:
        self.form, self.rope = form, rope_forms.FORMS[form]
        self.is_neox = is_neox
        self.layer_name, self.kv_cache_dtype = layer_name, kv_cache_dtype
        self.act_dtype, self.cache_dtype, self.table_dtype = act_dtype, cache_dtype, table_dtype
        self.head_size, self.value_head_size, self.rotary_dim = head_size, value_head_size, rotary_dim

    def example_inputs(self) -> list[torch.Tensor]:
        T, H, Hkv, D, Dv = (self.EXAMPLE_TOKENS, self.EXAMPLE_HEADS, self.EXAMPLE_KV_HEADS, self.head_size,
                            self.value_head_size)
        return [
            torch.empty(T, dtype=torch.int64),                                              # positions
            torch.empty(T, H * D, dtype=self.act_dtype),                                    # q
            torch.empty(T, Hkv * D, dtype=self.act_dtype),                                  # k
            torch.empty(T, Hkv * Dv, dtype=self.act_dtype),                                 # v
            torch.empty(self.EXAMPLE_BLOCKS, 4, Hkv, D, dtype=self.cache_dtype),            # key_cache
            torch.empty(self.EXAMPLE_BLOCKS, 4, Hkv, Dv, dtype=self.cache_dtype),           # value_cache
            torch.empty(self.EXAMPLE_POSITIONS, self.rotary_dim, dtype=self.table_dtype),  # cos_sin_cache
            torch.empty(1, dtype=torch.float32),                                            # k_scale
            torch.empty(1, dtype=torch.float32),                                            # v_scale
        ]

    def pattern(self, positions, q, k, v, key_cache, value_cache, cos_sin_cache, k_scale, v_scale):
        q_rot, k_rot = self.rope(positions, q, k, cos_sin_cache, self.head_size, self.rotary_dim, self.is_neox)
        update = auto_functionalized(
            UNIFIED_UPDATE, k=k_rot, v=v, key_cache=key_cache, value_cache=value_cache,
            layer_name=self.layer_name, kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
        )
        return update[0], update[1], update[2], q_rot, k_rot

    def replacement(self, positions, q, k, v, key_cache, value_cache, cos_sin_cache, k_scale, v_scale):
        fused = auto_functionalized(
            FUSED_UPDATE, q=q, k=k, v=v, key_cache=key_cache, value_cache=value_cache, positions=positions,
            cos_sin_cache=cos_sin_cache, is_neox=self.is_neox, layer_name=self.layer_name,
            kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
        )
        return fused[0], fused[3], fused[4], fused[1], fused[2]

    def extra_check(self, match: pm.Match) -> bool:
        return (pattern_utils.innermost_contiguous(match.kwargs["key_cache"])
                and pattern_utils.innermost_contiguous(match.kwargs["value_cache"])
                and pattern_utils.no_foreign_readers(match, ("q", "k")))

    def register(self, patterns: pm.PatternMatcherPass) -> None:
        pm.register_replacement(
            self.pattern, self.replacement, self.example_inputs(), pattern_utils.trace_pattern, patterns,
            extra_check=self.extra_check, pattern_name=f"rope_kvcache[{self.form},{self.is_neox}]",
        )


class RopeKVCacheFusionPass(pattern_utils.LazyPatternFusionPass):
    """Registers ``RopeKVCacheFusionPattern``s for the MHA cache updates it finds, then applies them."""

    name = "rope_kvcache_fusion"

    def enabled(self) -> bool:
        return self.config.rope_kvcache_enabled

    def _register_for(self, graph: fx.Graph) -> None:
        hint = pattern_utils.hint
        rotary_dims = {hint(node.kwargs["cos_sin_cache"].meta["val"].size(-1))
                       for node in find_auto_functionalized(graph, torch.ops.mla_fuse.rotary_embedding.default)}
        rotary_dims |= {hint(node.args[0].meta["val"].size(-1))
                        for node in graph.find_nodes(op="call_function", target=torch.ops.aten.index.Tensor)
                        if node.args[0].meta["val"].dim() == 2}
        for update in find_auto_functionalized(graph, UNIFIED_UPDATE):
            kv_cache_dtype = update.kwargs["kv_cache_dtype"]
            if kv_cache_dtype not in self.config.fusable_kv_cache_dtypes:
                continue
            k, key_cache, value_cache = (update.kwargs[n].meta["val"] for n in ("k", "key_cache", "value_cache"))
            head_size = hint(key_cache.size(-1))
            for rotary_dim in sorted(d for d in rotary_dims if d <= head_size):
                for table_dtype in sorted(pattern_utils.table_dtypes(graph), key=str):
                    for form in rope_forms.FORMS:
                        for is_neox in (False, True):
                            key = (update.kwargs["layer_name"], kv_cache_dtype, k.dtype, key_cache.dtype,
                                   table_dtype, head_size, hint(value_cache.size(-1)), rotary_dim, form, is_neox)
                            if key in self._registered:
                                continue
                            self._registered.add(key)
                            with pattern_utils.fake_mode():
                                RopeKVCacheFusionPattern(form, is_neox, *key[:8]).register(self.patterns)

    def uuid_sources(self):
        return (*super().uuid_sources(), pattern_utils, rope_forms, aliasing, rotary_embedding, unified_ops,
                repr(self.config))
