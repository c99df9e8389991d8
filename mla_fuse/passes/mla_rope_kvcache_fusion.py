"""MLARopeKVCacheFusionPass: RoPE of (q_pe, k_pe) + MLA cache update -> one fused op (CONTRACT §6)."""

from __future__ import annotations

import torch
import torch._inductor.pattern_matcher as pm
from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized

from mla_fuse.layers import rotary_embedding, unified_ops
from mla_fuse.passes import aliasing, pattern_utils, rope_forms
from mla_fuse.passes.fx_utils import call_args

UNIFIED_MLA_UPDATE = unified_ops.UNIFIED_MLA_UPDATE
FUSED_MLA_UPDATE = unified_ops.FUSED_MLA_UPDATE


class MLARopeKVCacheFusionPattern:
    """One rope form, one style, one cache format and geometry, every layer. Matched graph (``rope`` = the
    form's subgraph; ``NAME`` a wildcard bound by the match, passed to the replacement)::

        q_pe_rot, k_pe_rot = rope(positions, q_pe, k_pe, cos_sin_cache, is_neox)
        dummy = unified_mla_kv_cache_update(kv_c, k_pe_rot, NAME, DTYPE, k_scale)
        outputs: q_pe_rot (the anchor), dummy, k_pe_rot

    Replacement::

        f = auto_functionalized(fused_rope_and_unified_mla_kv_cache_update, positions=positions,
                                q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=cos_sin_cache,
                                is_neox=is_neox, layer_name=NAME, kv_cache_dtype=DTYPE, k_scale=k_scale)
        outputs: f[1] (q_pe rotated), f[0] (dummy), f[2] (k_pe rotated)

    The rotated q is the first output, so the matcher tries every candidate node as q's rope
    chain (q and k chains are the same subgraph up to shapes; anchored at the update, the
    matcher would take the first chain it meets, possibly k's again). ``extra_check`` then
    refuses a mis-binding (``pattern_utils.binding_is_sound``: distinct q_pe/k_pe/kv_c, ranks
    3/2/2, widths R, no cycle through another layer) and a pre-rotation value read elsewhere.
    The write-back of ``q_pe_rot`` into q (``copy``/``slice_scatter``) is not part of the
    pattern: defunctionalization removes it once the fused op writes q_pe in place.
    """

    EXAMPLE_TOKENS, EXAMPLE_HEADS, EXAMPLE_POSITIONS = 5, 2, 64

    def __init__(self, form: str, is_neox: bool, call_form: pattern_utils.CallForm, kv_cache_dtype: str,
                 act_dtype: torch.dtype, table_dtype: torch.dtype, latent_dim: int, rope_dim: int) -> None:
        self.form, self.rope = form, rope_forms.FORMS[form]
        self.call_form = call_form
        self.is_neox = is_neox
        self.kv_cache_dtype = kv_cache_dtype
        self.act_dtype, self.table_dtype = act_dtype, table_dtype
        self.latent_dim, self.rope_dim = latent_dim, rope_dim

    def example_inputs(self) -> list[torch.Tensor]:
        T, H, L, R = self.EXAMPLE_TOKENS, self.EXAMPLE_HEADS, self.latent_dim, self.rope_dim
        return [
            torch.empty(T, dtype=torch.int64),                               # positions
            torch.empty(T, H, R, dtype=self.act_dtype),                      # q_pe
            torch.empty(T, R, dtype=self.act_dtype),                         # k_pe
            torch.empty(T, L, dtype=self.act_dtype),                         # kv_c
            torch.empty(self.EXAMPLE_POSITIONS, R, dtype=self.table_dtype),  # cos_sin_cache
            torch.empty(1, dtype=torch.float32),                             # k_scale
        ]

    def pattern(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, k_scale, layer_name):
        q_pe_rot, k_pe_rot = self.rope(positions, q_pe, k_pe, cos_sin_cache, self.rope_dim, self.rope_dim,
                                       self.is_neox)
        dummy = self.call_form.call(UNIFIED_MLA_UPDATE, kv_c_normed=kv_c, k_pe=k_pe_rot, layer_name=layer_name,
                                    kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale)
        return q_pe_rot, dummy, k_pe_rot

    def replacement(self, positions, q_pe, k_pe, kv_c, cos_sin_cache, k_scale, layer_name):
        fused = auto_functionalized(
            FUSED_MLA_UPDATE, positions=positions, q_pe=q_pe, k_pe=k_pe, kv_c=kv_c, cos_sin_cache=cos_sin_cache,
            is_neox=self.is_neox, layer_name=layer_name, kv_cache_dtype=self.kv_cache_dtype, k_scale=k_scale,
        )
        return fused[1], fused[0], fused[2]

    @property
    def name(self) -> str:
        return f"mla_rope_kvcache[{self.form},{self.is_neox},{self.kv_cache_dtype}]"

    def precheck(self, match: pm.Match) -> bool:
        return pattern_utils.inputs_distinct(match, ("q_pe", "k_pe", "kv_c"))

    def extra_check(self, match: pm.Match) -> bool:
        ranks = {"q_pe": 3, "k_pe": 2, "kv_c": 2}
        widths = {"q_pe": self.rope_dim, "k_pe": self.rope_dim, "kv_c": self.latent_dim}
        return (pattern_utils.binding_is_sound(match, ranks, widths)
                and pattern_utils.no_foreign_readers(match, ("q_pe", "k_pe")))


class MLARopeKVCacheFusionPass(pattern_utils.LazyPatternFusionPass):
    """Registers ``MLARopeKVCacheFusionPattern``s for the forms of the MLA cache updates it finds (one set for
    all layers of one shape), then applies them."""

    name = "mla_rope_kvcache_fusion"
    update_op = UNIFIED_MLA_UPDATE

    def enabled(self) -> bool:
        return self.config.mla_rope_kvcache_enabled

    def _register_for(self, graph: fx.Graph, updates: list[fx.Node]) -> None:
        hint = pattern_utils.hint
        forms, table_dtypes = rope_forms.present(graph), sorted(pattern_utils.table_dtypes(graph), key=str)
        configs = set()
        for update in updates:
            args = call_args(update)
            kv_c, k_pe = args["kv_c_normed"].meta["val"], args["k_pe"].meta["val"]
            configs |= {(pattern_utils.CallForm.of(update), args["kv_cache_dtype"], kv_c.dtype, table_dtype,
                         hint(kv_c.size(-1)), hint(k_pe.size(-1))) for table_dtype in table_dtypes}
        for config in sorted(configs, key=repr):
            for form, is_neox in forms:
                self.register(MLARopeKVCacheFusionPattern(form, is_neox, *config), (form, is_neox, *config))

    def uuid_sources(self):
        return (*super().uuid_sources(), pattern_utils, rope_forms, aliasing, rotary_embedding, unified_ops,
                repr(self.config))
