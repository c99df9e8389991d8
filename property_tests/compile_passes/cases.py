"""Cases of the compile-pass properties and the strategies that draw them.

A ``CompileCase`` is a toy model (``models.ModelSpec``: MLA, MHA or hybrid stacks of 1-3
layers, each layer in a situation), the engine cache layout (``engine_caches.CacheLayout``),
the cache format, a step, how it is compiled (backend, dynamic token count, the fusion
configuration) and a seed. ``expected_fused`` says, from CONTRACT §6 alone, which layers the
fusion must rewrite.

Strategies shrink toward the plain case: one MLA layer, the custom-op rope, an ``auto``
cache in separate allocations, O2, dynamic tokens, the light backend.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import strategies as st

from mla_fuse_conformance.settings import profiles
from mla_fuse_conformance.cases import types as case_types
from mla_fuse_conformance.cases.engine_caches import CacheLayout
from mla_fuse_conformance.compile_passes.layers import FUSING_SITUATIONS, ROPE_FORMS, SITUATIONS
from mla_fuse_conformance.compile_passes.models import MhaGeometry, MlaGeometry, ModelSpec
from mla_fuse_conformance.cases.sizes import weighted

ALL_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8", "fp8_e4m3", "fp8_e5m2")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e5m2", "fp8_e4m3")
UPDATE_OP = {"mla": "mla_fuse::unified_mla_kv_cache_update", "mha": "mla_fuse::unified_kv_cache_update"}
FLAG = {"mla": "fuse_mla_rope_kvcache", "mha": "fuse_rope_kvcache"}
# K/V forms each pool layout of the engines takes (``engine_caches.build_caches``): K and V in separate
# allocations ("split") only in separate pools, the interleaved pool only with K|V in one entry
KV_FORMS_OF_POOL = {"separate": ("split", "flash", "flashinfer", "halves"),
                    "chunked": ("flash", "flashinfer", "halves"), "interleaved": ("flashinfer", "halves")}
CACHE_SLOTS = 32  # cache capacity in tokens, whatever the block size
# Share (in %) of drawn examples compiled with real Inductor (C++ code generation, ~10-40 s an
# example on a CPU); every profile also runs the property's explicit Inductor examples.
INDUCTOR_SHARE = {"ci": 8, "dev": 10, "gpu": 25, "nightly": 25}


@dataclasses.dataclass(frozen=True)
class FusionSettings:
    """The ``mla_fuse.compile`` arguments: level, fusion flags, split points, fusable formats."""

    level: int = 2
    fuse_mla_rope_kvcache: bool | None = None
    fuse_rope_kvcache: bool | None = None
    splitting_ops: tuple[str, ...] = ()
    fusable_kv_cache_dtypes: tuple[str, ...] = ALL_KV_CACHE_DTYPES

    def kwargs(self) -> dict:
        return dataclasses.asdict(self)

    def allows(self, kind: str, kv_cache_dtype: str) -> bool:
        """CONTRACT §6: off at O0, at O1 unless its flag is set, when its flag is off, when its update
        op is a split point, and for a cache format outside the fusable ones."""
        flag = getattr(self, FLAG[kind])
        if self.level == 0 or UPDATE_OP[kind] in self.splitting_ops:
            return False
        enabled = self.level >= 2 if flag is None else flag
        return enabled and kv_cache_dtype in self.fusable_kv_cache_dtypes


@dataclasses.dataclass(frozen=True)
class CompileCase:
    """One fuzzed model, cache, step and compile; ``repr`` is valid Python (the names are importable
    from ``mla_fuse_conformance.properties.test_compile_passes``)."""

    model: ModelSpec
    layout: CacheLayout = CacheLayout("separate", "split")
    kv_cache_dtype: str = "auto"
    fp8_storage: str = "uint8"            # fp8 caches: "uint8" codes or the matching "float8" dtype
    block_size: int = 4
    tokens: int = 3                       # >= 2 (dynamo specializes 0 and 1)
    second_tokens: int = 0                # dynamic: a second step with this many tokens, same graph
    padded: tuple[int, ...] = ()          # token indices with slot -1 (every layer)
    unmapped: tuple[int, ...] = ()        # layers with no slot mapping this step (rotate only)
    backend: str = "light"
    dynamic: bool = True
    settings: FusionSettings = FusionSettings()
    seed: int = 0

    @property
    def blocks(self) -> int:
        return math.ceil(CACHE_SLOTS / self.block_size)

    def expected_fused(self) -> list[bool]:
        """Per layer: the fusion must rewrite it (allowed, and the layer in a situation that fuses)."""
        return [situation in FUSING_SITUATIONS and self.settings.allows(kind, self.kv_cache_dtype)
                for kind, situation in zip(self.model.kinds, self.model.situations)]


def describe(case: CompileCase) -> list[str]:
    """The kinds of case this is, for ``--hypothesis-show-statistics``."""
    model = case.model
    fused = case.expected_fused()
    texts = [f"backend: {case.backend}", f"tokens: {'dynamic' if case.dynamic else 'static'}",
             f"layers: {'+'.join(model.kinds)}", f"rope: {model.rope}", f"style: {'neox' if model.is_neox else 'gptj'}",
             f"dtype: {model.dtype}", f"kv_cache_dtype: {case.kv_cache_dtype}", f"layout: {case.layout.describe()}",
             f"level: O{case.settings.level}",
             f"fused layers: {'all' if all(fused) else 'none' if not any(fused) else 'some'}"]
    texts += [f"situation: {s}" for s in set(model.situations) - {"plain"}]
    if case.kv_cache_dtype.startswith("fp8"):
        texts.append(f"fp8 storage: {case.fp8_storage}")
    if model.shared_rope and len(model.kinds) > 1:
        texts.append("one rope module shared by the layers")
    if case.settings.splitting_ops:
        texts.append("a split point")
    if case.settings.fusable_kv_cache_dtypes != ALL_KV_CACHE_DTYPES:
        texts.append("narrowed fusable formats")
    return texts


# ------------------------------------------------------------------ strategies


@st.composite
def mla_geometries(draw) -> MlaGeometry:
    return MlaGeometry(heads=draw(st.sampled_from((2, 1, 3, 4, 5))), nope=draw(st.sampled_from((8, 2, 4, 6))),
                       rope_dim=draw(st.sampled_from((8, 2, 4, 6, 12))), latent=draw(st.sampled_from((16, 4, 5, 8, 20))),
                       v_dim=draw(st.sampled_from((8, 2, 4, 6))))


@st.composite
def mha_geometries(draw) -> MhaGeometry:
    heads = draw(st.sampled_from((2, 1, 3, 4, 5)))
    kv_heads = draw(st.sampled_from([d for d in range(heads, 0, -1) if heads % d == 0]))
    head_size = draw(st.sampled_from((16, 4, 6, 7, 8, 10, 12)))
    rotary_dim = draw(st.sampled_from([r for r in range(2, head_size + 1, 2)][::-1]))  # shrinks to full rotary
    return MhaGeometry(heads, kv_heads, head_size, rotary_dim)


@st.composite
def model_specs(draw) -> ModelSpec:
    layers = draw(st.integers(1, 3))
    kinds = tuple(draw(st.sampled_from(("mla", "mha"))) for _ in range(layers))
    situations = tuple(draw(weighted(("plain", 12), *((s, 1) for s in SITUATIONS[1:])))
                       for _ in range(layers))
    return ModelSpec(kinds=kinds, situations=situations, hidden=draw(st.sampled_from((32, 16, 8, 24))),
                     dtype=draw(st.sampled_from(("bfloat16", "float16", "float32"))), is_neox=draw(st.booleans()),
                     rope=draw(st.sampled_from(ROPE_FORMS)), shared_rope=draw(st.booleans()),
                     mla=draw(mla_geometries()), mha=draw(mha_geometries()), seed=draw(st.integers(0, 2 ** 32 - 1)))


@st.composite
def cache_layouts(draw) -> CacheLayout:
    pool = draw(st.sampled_from(tuple(KV_FORMS_OF_POOL)))
    kv = draw(st.sampled_from(KV_FORMS_OF_POOL[pool]))
    return CacheLayout(pool, kv, hnd=draw(st.booleans()))


@st.composite
def fusion_settings(draw, kinds: tuple[str, ...], kv_cache_dtype: str) -> FusionSettings:
    """Mostly O2/O3 with fusion on; else each way the fusion must stay off (or is switched on at O1)."""
    choice = draw(weighted(("on", 10), ("O3", 2), ("O1", 2), ("O0", 1), ("flag off", 2), ("flag on at O1", 1),
                           ("split point", 2), ("narrowed formats", 2)))
    kind = draw(st.sampled_from(sorted(set(kinds))))
    if choice in ("on", "O3", "O1", "O0"):
        return FusionSettings(level={"on": 2, "O3": 3, "O1": 1, "O0": 0}[choice])
    if choice == "flag off":
        return FusionSettings(level=draw(st.sampled_from((2, 3))), **{FLAG[kind]: False})
    if choice == "flag on at O1":
        return FusionSettings(level=1, **{FLAG[kind]: True})
    if choice == "split point":
        return FusionSettings(splitting_ops=(UPDATE_OP[kind],))
    others = [d for d in ALL_KV_CACHE_DTYPES if d != kv_cache_dtype]
    kept = draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
    if draw(st.booleans()):
        kept.append(kv_cache_dtype)  # narrowed, but still fusable
    return FusionSettings(fusable_kv_cache_dtypes=tuple(kept))


def inductor_share() -> int:
    return INDUCTOR_SHARE.get(profiles.current() or "dev", 10)


def _other_count(draw, tokens: int) -> int:
    """A token count other than ``tokens``, >= 2."""
    other = draw(st.integers(2, 8))
    return other if other != tokens else tokens + 1


@st.composite
def compile_cases(draw, backend: str | None = None) -> CompileCase:
    model = draw(model_specs())
    kv_cache_dtype = draw(st.sampled_from(KV_CACHE_DTYPES))
    tokens = draw(st.integers(2, 8))
    dynamic = draw(st.integers(0, 3)) != 3  # most examples compile with a dynamic token count
    if draw(st.integers(0, 7)) == 7:  # rarely every slot padded (nothing written)
        padded = tuple(range(tokens))
    else:
        padded = tuple(sorted(draw(st.sets(st.integers(0, tokens - 1), max_size=tokens - 1))))
    layers = len(model.kinds)
    unmapped = tuple(sorted(draw(st.sets(st.integers(0, layers - 1), max_size=layers - 1)))) if layers > 1 else ()
    if backend is None:
        backend = "inductor" if draw(st.integers(0, 99)) >= 100 - inductor_share() else "light"
    return CompileCase(
        model=model, layout=draw(cache_layouts()), kv_cache_dtype=kv_cache_dtype,
        fp8_storage=draw(st.sampled_from(("uint8", "float8"))) if kv_cache_dtype.startswith("fp8") else "uint8",
        block_size=draw(st.sampled_from((4, 1, 5, 16))), tokens=tokens,
        second_tokens=_other_count(draw, tokens) if dynamic else 0,
        padded=padded, unmapped=unmapped, backend=backend, dynamic=dynamic,
        settings=draw(fusion_settings(model.kinds, kv_cache_dtype)), seed=draw(st.integers(0, 2 ** 32 - 1)),
    )


# A compile case is stored in failure files like the kernel cases (``types.to_jsonable``/``from_jsonable``):
# ``mla-fuse repro FILE`` rebuilds it without hypothesis.
case_types.CASE_TYPES.update({cls.__name__: cls for cls in (
    CompileCase, FusionSettings, ModelSpec, MlaGeometry, MhaGeometry, CacheLayout)})
