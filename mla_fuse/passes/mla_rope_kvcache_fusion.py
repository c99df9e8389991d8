"""MLARopeKVCacheFusionPass: RoPE of (q_pe, k_pe) + MLA cache update -> one fused op (CONTRACT §6)."""

from __future__ import annotations

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized

from mla_fuse.layers import rotary_embedding, unified_ops
from mla_fuse.passes import aliasing, pattern_utils, rope_forms
from mla_fuse.passes.fx_utils import find_auto_functionalized

UNIFIED_MLA_UPDATE = unified_ops.UNIFIED_MLA_UPDATE
FUSED_MLA_UPDATE = unified_ops.FUSED_MLA_UPDATE


class MLARopeKVCacheFusionPattern:
    """One layer, one rope form, one style. Matched graph (``rope`` = the form's subgraph)::

        q_pe_rot, k_pe_rot = rope(positions, q_pe, k_pe, cos_sin_cache, is_neox)
        upd = auto_functionalized(unified_mla_kv_cache_update, kv_c=kv_c, k_pe=k_pe_rot,
                                  kv_cache=kv_cache, layer_name=NAME, kv_cache_dtype=DTYPE, k_scale=k_scale)
        outputs: upd[0] (dummy), upd[1] (new cache), q_pe_rot, k_pe_rot

    Replacement::

        f = auto_functionalized(fused_rope_and_unified_mla_kv_cache_update, q_pe=q_pe, k_pe=k_pe,
                                kv_c=kv_c, kv_cache=kv_cache, positions=positions,
                                cos_sin_cache=cos_sin_cache, is_neox=is_neox, layer_name=NAME,
                                kv_cache_dtype=DTYPE, k_scale=k_scale)
        outputs: f[0], f[3], f[1], f[2]

    The write-back of ``q_pe_rot`` into q (``copy``/``slice_scatter``) is not part of the
    pattern: defunctionalization removes it once the fused op writes q_pe in place.
    Refused when the pre-rotation ``q_pe``/``k_pe`` (or the projections they view) have
    readers outside the pattern, or the cache's innermost stride is not 1.
    """

    EXAMPLE_TOKENS, EXAMPLE_HEADS, EXAMPLE_BLOCKS, EXAMPLE_POSITIONS = 5, 2, 4, 64

    def __init__(self, form: str, is_neox: bool, layer_name: str, kv_cache_dtype: str, act_dtype: torch.dtype,
                 cache_dtype: torch.dtype, table_dtype: torch.dtype, latent_dim: int, rope_dim: int) -> None:
        self.form, self.rope = form, rope_forms.FORMS[form]
        self.is_neox = is_neox
        self.layer_name, self.kv_cache_dtype = layer_name, kv_cache_dtype
        self.act_dtype, self.cache_dtype, self.table_dtype = act_dtype, cache_dtype, table_dtype
        self.latent_dim, self.rope_dim = latent_dim, rope_dim

    def example_inputs(self) -> list[torch.Tensor]:
        T, H, L, R = self.EXAMPLE_TOKENS, self.EXAMPLE_HEADS, self.latent_dim, self.rope_dim
        return [
            torch.empty(T, dtype=torch.int64),                                  # positions
            torch.empty(T, H, R, dtype=self.act_dtype),                         # q_pe
            torch.empty(T, R, dtype=self.act_dtype),                            # k_pe
            torch.empty(T, L, dtype=self.act_dtype),                            # kv_c
            torch.empty(self.EXAMPLE_BLOCKS, 4, L + R, dtype=self.cache_dtype),  # kv_cache
            torch.empty(self.EXAMPLE_POSITIONS, R, dtype=self.table_dtype),     # cos_sin_cache
            torch.empty(1, dtype=torch.float32),                                # k_scale
        ]

    def pattern(self, positions, q_pe, k_pe, kv_c, kv_cache, cos_sin_cache, k_scale):
        q_pe_rot, k_pe_rot = self.rope(positions, q_pe, k_pe, cos_sin_cache, self.rope_dim, self.rope_dim,
                                       self.is_neox)
        update = auto_functionalized(
            UNIFIED_MLA_UPDATE, kv_c=kv_c, k_pe=k_pe_rot, kv_cache=kv_cache, layer_name=self.layer_name,
            kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale,
        )
        return update[0], update[1], q_pe_rot, k_pe_rot

    def replacement(self, positions, q_pe, k_pe, kv_c, kv_cache, cos_sin_cache, k_scale):
        fused = auto_functionalized(
            FUSED_MLA_UPDATE, q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, kv_cache=kv_cache, positions=positions,
            cos_sin_cache=cos_sin_cache, is_neox=self.is_neox, layer_name=self.layer_name,
            kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale,
        )
        return fused[0], fused[3], fused[1], fused[2]

    def extra_check(self, match: pm.Match) -> bool:
        return (pattern_utils.innermost_contiguous(match.kwargs["kv_cache"])
                and pattern_utils.no_foreign_readers(match, ("q_pe", "k_pe")))

    def register(self, patterns: pm.PatternMatcherPass) -> None:
        pm.register_replacement(
            self.pattern, self.replacement, self.example_inputs(), pattern_utils.trace_pattern, patterns,
            extra_check=self.extra_check, pattern_name=f"mla_rope_kvcache[{self.form},{self.is_neox}]",
        )


class MLARopeKVCacheFusionPass(pattern_utils.LazyPatternFusionPass):
    """Registers ``MLARopeKVCacheFusionPattern``s for the MLA cache updates it finds, then applies them."""

    name = "mla_rope_kvcache_fusion"

    def enabled(self) -> bool:
        return self.config.mla_rope_kvcache_enabled

    def _register_for(self, graph: fx.Graph) -> None:
        for update in find_auto_functionalized(graph, UNIFIED_MLA_UPDATE):
            kv_cache_dtype = update.kwargs["kv_cache_dtype"]
            if kv_cache_dtype not in self.config.fusable_kv_cache_dtypes:
                continue
            kv_c, k_pe, kv_cache = (update.kwargs[name].meta["val"] for name in ("kv_c", "k_pe", "kv_cache"))
            for table_dtype in sorted(pattern_utils.table_dtypes(graph), key=str):
                for form in rope_forms.FORMS:
                    for is_neox in (False, True):
                        key = (update.kwargs["layer_name"], kv_cache_dtype, kv_c.dtype, kv_cache.dtype, table_dtype,
                               pattern_utils.hint(kv_c.size(-1)), pattern_utils.hint(k_pe.size(-1)), form, is_neox)
                        if key in self._registered:
                            continue
                        self._registered.add(key)
                        with pattern_utils.fake_mode():
                            MLARopeKVCacheFusionPattern(form, is_neox, *key[:7]).register(self.patterns)

    def uuid_sources(self):
        return (*super().uuid_sources(), pattern_utils, rope_forms, aliasing, rotary_embedding, unified_ops,
                repr(self.config))
