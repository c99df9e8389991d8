"""Fuzzing the torch.compile fusion passes (CONTRACT §6, docs/PASSES.md).

Each example draws a toy model (MLA or MHA, 1-3 layers, geometry, dtype, NeoX/GPT-J, rope
form), per-layer paged caches (``auto``, ``fp8``, ``fp8_e5m2`` in uint8 storage), a step
(token count >= 2, padded slots, sometimes a layer without a slot mapping) and a seed, then
compiles the model with the light backend (the graph Inductor's custom pass sees, the
same passes, run eagerly) and checks:

* ``test_fusion_fires_once_per_layer_and_matches_eager`` (O2): the fusion's match count and
  the final graph both say one fused node per layer (in place, not ``auto_functionalized``,
  before that layer's attention), no unfused rope or cache-update node, no ``slice_scatter``
  (the q write-back went with defunctionalization), the fused kernel is what runs (kernel
  calls counted), and the model output, every layer's rotated q and k and every cache are
  bitwise equal to the eager model calling the unfused kernels (custom-op rope).
* ``test_no_fusion_below_o2_and_matches_eager`` (O1, or O2/O3 with the fusion flag off):
  match count 0, every unified update node left, only unfused kernels called, and the same
  results bitwise as the eager model of the same rope form.

These do not use ``harness.prop``: they test the passes (through ``mla_fuse.ops``), not the
implementation under ``--impl``, and stay out of the mutant self-test. A failing example
prints ``case = CompileCase(...)``; replay it without hypothesis with
``python -c "from mla_fuse_conformance.test_compile_passes import *; check_fused(CompileCase(...))"``
(or ``check_unfused``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

import mla_fuse.compile as mc
from mla_fuse_conformance import profiles
from mla_fuse_conformance.implementation import resolve_spec
from mla_fuse.layers import (
    DeepseekScalingRotaryEmbedding, LayerKVCache, MHAAttention, MLAAttention, RotaryEmbedding,
)
from mla_fuse_conformance.pass_models import (
    FUSED_MHA, FUSED_MLA, POSITIONS, ROPE_FORMS, ROTARY, UNIFIED_MHA, UNIFIED_MLA, Step, ToyModel, _filled,
    assert_same_results, clone_caches, compile_light, count_calls, count_slice_scatters, counting_kernel_calls,
    final_graph, native_rope_nodes, run, same_weights,
)

CACHE_DTYPES = ("auto", "fp8", "fp8_e5m2")  # fp8 in uint8 storage (float8 storage: a documented CPU non-match)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CACHE_SLOTS = 32  # cache capacity in tokens, whatever the block size
ATTENTION = {"mla": torch.ops.mla_fuse.unified_mla_attention.default,
             "mha": torch.ops.mla_fuse.unified_attention.default}
PASS_NAME = {"mla": "mla_rope_kvcache_fusion", "mha": "rope_kvcache_fusion"}
FUSED_KERNEL = {"mla": "concat_and_cache_mla_rope_fused", "mha": "rope_and_reshape_and_cache_flash"}
CACHE_KERNEL = {"mla": "concat_and_cache_mla", "mha": "reshape_and_cache_flash"}


@dataclasses.dataclass(frozen=True)
class CompileCase:
    """One fuzzed model + step; ``repr`` is valid Python (``CompileCase`` is importable here)."""

    kind: str               # "mla" | "mha"
    layers: int             # 1-3
    hidden: int
    heads: int
    kv_heads: int           # MHA (GQA); MLA: 1
    nope: int               # MLA qk_nope_head_dim; MHA: 0
    head_size: int          # MLA: qk_rope_head_dim (== rotary_dim); MHA: D
    rotary_dim: int         # even, <= head_size (MHA: partial rotary when <)
    latent: int             # MLA kv_lora_rank; MHA: 0
    v_dim: int              # MLA v_head_dim; MHA: == head_size
    dtype: str
    is_neox: bool
    rope: str               # ROPE_FORMS: "custom_op" | "native" | "deepseek_native" (YaRN table, native form)
    kv_cache_dtype: str
    block_size: int
    tokens: int             # >= 2
    padded: tuple[int, ...]  # token indices with slot -1 (every layer)
    unmapped: tuple[int, ...]  # layers with no slot mapping this step (rotate only, write nothing)
    seed: int

    @property
    def layer_names(self) -> list[str]:
        return [f"model.layers.{i}.attn" for i in range(self.layers)]


def describe(case: CompileCase) -> list[str]:
    """The kinds of case this is, for ``--hypothesis-show-statistics``."""
    heads = "1" if case.heads == 1 else "power of two" if case.heads & (case.heads - 1) == 0 else "non-power of two"
    texts = [f"model: {case.kind}", f"layers: {case.layers}", f"dtype: {case.dtype}",
             f"style: {'neox' if case.is_neox else 'gptj'}", f"rope: {case.rope}",
             f"kv_cache_dtype: {case.kv_cache_dtype}", f"heads: {heads}",
             f"padded slots: {'all' if len(case.padded) == case.tokens else 'some'}",
             f"tokens: {'2' if case.tokens == 2 else '3+'}"]
    if case.unmapped:
        texts.append("a layer without slot mapping")
    if case.kind == "mha":
        texts.append("GQA (kv_heads < heads)" if case.kv_heads < case.heads else "MHA (kv_heads == heads)")
        if case.rotary_dim < case.head_size:
            texts.append("partial rotary (R < D)")
        if case.head_size % 2:
            texts.append("odd head size")
    elif case.rotary_dim & (case.rotary_dim - 1):
        texts.append("rotary dim not a power of two")
    return texts


@st.composite
def compile_cases(draw) -> CompileCase:
    kind = draw(st.sampled_from(("mla", "mha")))
    layers = draw(st.integers(1, 3))
    hidden = draw(st.sampled_from((16, 8, 24)))
    heads = draw(st.sampled_from((1, 2, 3, 4, 5)))
    if kind == "mla":
        kv_heads, latent = 1, draw(st.sampled_from((8, 4, 5, 16, 20)))
        nope = draw(st.sampled_from((4, 2, 6, 8)))
        head_size = rotary_dim = draw(st.sampled_from((4, 2, 6, 8, 12)))
        v_dim = draw(st.sampled_from((4, 2, 6)))
    else:
        kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
        nope, latent = 0, 0
        head_size = draw(st.sampled_from((8, 4, 6, 10, 12, 16, 7)))
        rotary_dim = draw(st.sampled_from([r for r in range(2, head_size + 1, 2)][::-1]))  # shrinks to full rotary
        v_dim = head_size
    tokens = draw(st.integers(2, 8))
    if draw(st.integers(0, 7)) == 7:  # rarely every slot padded (nothing written)
        padded = tuple(range(tokens))
    else:
        padded = tuple(sorted(draw(st.sets(st.integers(0, tokens - 1), min_size=1, max_size=tokens - 1))))
    unmapped = draw(st.sets(st.integers(0, layers - 1), max_size=layers - 1).map(lambda s: tuple(sorted(s)))
                    if layers > 1 else st.just(()))
    return CompileCase(
        kind=kind, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, nope=nope, head_size=head_size,
        rotary_dim=rotary_dim, latent=latent, v_dim=v_dim,
        dtype=draw(st.sampled_from(tuple(DTYPES))), is_neox=draw(st.booleans()),
        rope=draw(st.sampled_from(ROPE_FORMS)), kv_cache_dtype=draw(st.sampled_from(CACHE_DTYPES)),
        block_size=draw(st.sampled_from((4, 1, 5, 16))), tokens=tokens, padded=padded, unmapped=unmapped,
        seed=draw(st.integers(0, 2 ** 32 - 1)),
    )


# ------------------------------------------------------------------ building a case


def _rope(case: CompileCase, use_custom_op: bool) -> RotaryEmbedding:
    if case.rope == "deepseek_native":
        return DeepseekScalingRotaryEmbedding(case.head_size, case.rotary_dim, POSITIONS // 4, 10000.0, case.is_neox,
                                              4.0, mscale=0.707, mscale_all_dim=0.707, use_custom_op=use_custom_op)
    return RotaryEmbedding(case.head_size, case.rotary_dim, POSITIONS, 10000.0, case.is_neox,
                           use_custom_op=use_custom_op)


def build_model(case: CompileCase, use_custom_op: bool | None = None) -> ToyModel:
    """The case's model (seeded weights); ``use_custom_op=True`` gives the eager reference's rope."""
    custom = case.rope == "custom_op" if use_custom_op is None else use_custom_op
    torch.manual_seed(case.seed)
    if case.kind == "mla":
        layers = [MLAAttention(case.hidden, case.heads, case.nope, case.head_size, case.v_dim, case.latent,
                               _rope(case, custom), name) for name in case.layer_names]
    else:
        layers = [MHAAttention(case.hidden, case.heads, case.kv_heads, case.head_size, _rope(case, custom), name)
                  for name in case.layer_names]
    return ToyModel(layers).to(DTYPES[case.dtype])


def build_caches(case: CompileCase) -> dict[str, LayerKVCache]:
    """Sentinel-filled caches; fp8 in uint8 storage; a distinct scale per layer."""
    storage = torch.uint8 if case.kv_cache_dtype.startswith("fp8") else DTYPES[case.dtype]
    blocks = math.ceil(CACHE_SLOTS / case.block_size)
    caches = {}
    for i, name in enumerate(case.layer_names):
        if case.kind == "mla":
            caches[name] = LayerKVCache(
                case.kv_cache_dtype, kv_cache=_filled((blocks, case.block_size, case.latent + case.head_size), storage),
                k_scale=torch.tensor([0.05 * (i + 1)], dtype=torch.float32))
        else:
            shape = (blocks, case.block_size, case.kv_heads, case.head_size)
            caches[name] = LayerKVCache(
                case.kv_cache_dtype, key_cache=_filled(shape, storage), value_cache=_filled(shape, storage),
                k_scale=torch.tensor([0.05 * (i + 1)], dtype=torch.float32),
                v_scale=torch.tensor([0.03 * (i + 1)], dtype=torch.float32))
    return caches


def build_step(case: CompileCase, table_rows: int) -> Step:
    """Positions anywhere in the table (last row included), hidden states, per layer distinct slots."""
    generator = torch.Generator().manual_seed(case.seed)
    positions = torch.randint(0, table_rows, (case.tokens,), generator=generator)
    hidden = torch.randn(case.tokens, case.hidden, generator=generator).to(DTYPES[case.dtype])
    slot_mapping = {}
    for i, name in enumerate(case.layer_names):
        slots = torch.randperm(CACHE_SLOTS, generator=generator)[:case.tokens]
        slots[list(case.padded)] = -1
        slot_mapping[name] = None if i in case.unmapped else slots
    return Step(positions, hidden, slot_mapping)


def _announce(case: CompileCase) -> None:
    note(f"case = {case!r}")
    for text in describe(case):
        event(text)


def _run_compiled(case: CompileCase, reference: ToyModel, **compile_kwargs):
    """Eager ``reference`` and the compiled case model on copies of the same caches and step."""
    model = same_weights(reference, build_model(case))
    caches = build_caches(case)
    expected_caches = clone_caches(caches)
    step = build_step(case, model.layers[0].rotary_emb.cos_sin_cache.size(0))
    expected = run(reference, expected_caches, step)
    compiled = compile_light(model, **compile_kwargs)
    with counting_kernel_calls() as calls:
        result = run(compiled, caches, step)
    return compiled, dict(calls), (result, expected, caches, expected_caches)


# ------------------------------------------------------------------ the checks (also callable outside hypothesis)


def check_fused(case: CompileCase) -> None:
    """O2: one fused node per layer, nothing unfused left, the fused kernel runs, bitwise == eager unfused."""
    reference = build_model(case, use_custom_op=True)  # eager calls the unfused kernels
    compiled, calls, results = _run_compiled(case, reference, level=2)
    graph = final_graph(compiled)
    counts = mc.match_counts(compiled)
    n, kind = case.layers, case.kind
    fused_op, unified_op = (FUSED_MLA, UNIFIED_MLA) if kind == "mla" else (FUSED_MHA, UNIFIED_MHA)
    assert counts[PASS_NAME[kind]] == n, f"match counts {counts}, expected {n} fusions"
    assert counts[PASS_NAME["mha" if kind == "mla" else "mla"]] == 0, counts
    assert counts["defunctionalization"] == n, counts
    assert count_calls(graph, fused_op) == n, f"{count_calls(graph, fused_op)} fused nodes in the final graph"
    assert count_calls(graph, unified_op) == 0, "unfused cache update left in the graph"
    assert count_calls(graph, ROTARY) == 0 and native_rope_nodes(graph) == 0, "unfused rope left in the graph"
    assert count_slice_scatters(graph) == 0, "slice_scatter (q write-back) left after defunctionalization"
    nodes = list(graph.nodes)
    fused = {n.kwargs["layer_name"]: n for n in nodes if n.target is fused_op}
    assert all(node.op == "call_function" for node in fused.values())  # in place, not auto_functionalized
    assert sorted(fused) == case.layer_names, sorted(fused)
    for node in nodes:  # the dummy still orders each layer's attention after its cache write
        if node.target is ATTENTION[kind]:
            layer = node.args[4]
            assert nodes.index(fused[layer]) < nodes.index(node), f"{layer}: attention before the fused write"
    mapped = n - len(case.unmapped)
    expected_calls = {FUSED_KERNEL[kind]: mapped, "rotary_embedding": len(case.unmapped)}
    assert calls == {k: v for k, v in expected_calls.items() if v}, f"kernel calls {calls}"
    assert_same_results(*results)


def check_unfused(case: CompileCase, **compile_kwargs) -> None:
    """Fusion off: no match, the unified update of each layer stays, bitwise == eager (same rope form)."""
    reference = build_model(case)
    compiled, calls, results = _run_compiled(case, reference, **compile_kwargs)
    graph = final_graph(compiled)
    counts = mc.match_counts(compiled)
    unified_op, fused_op = (UNIFIED_MLA, FUSED_MLA) if case.kind == "mla" else (UNIFIED_MHA, FUSED_MHA)
    assert counts.get("mla_rope_kvcache_fusion", 0) == 0 and counts.get("rope_kvcache_fusion", 0) == 0, counts
    assert counts.get("defunctionalization", 0) == 0, counts
    assert count_calls(graph, fused_op) == 0 and count_calls(graph, unified_op) == case.layers
    if case.rope == "custom_op":
        assert count_calls(graph, ROTARY) == case.layers, "rope custom op lost"
    else:
        assert count_calls(graph, ROTARY) == 0 and native_rope_nodes(graph) >= case.layers, "native rope lost"
    # (the layers' rope custom op is bound to the kernel directly: only the cache writes are counted)
    mapped = case.layers - len(case.unmapped)
    assert calls == ({CACHE_KERNEL[case.kind]: mapped} if mapped else {}), f"kernel calls {calls}"
    assert_same_results(*results)


# ------------------------------------------------------------------ the properties

# A light compile of a 3-layer model takes ~1 s on the CPU, so the ci profile's count would take
# this file past its budget (60 s with -n 2); every other profile keeps its own count.
@pytest.fixture(scope="module", autouse=True)
def passes_run_on_our_kernels(request):
    """The passes insert mla_fuse's own ops, so these properties check the ``triton`` implementation only."""
    spec = resolve_spec(request.config.getoption("--impl"))
    if spec != "triton":
        pytest.skip(f"compile passes call mla_fuse.ops (the triton implementation); --impl={spec} does not apply")


CI_EXAMPLES = {"fused": 20, "unfused": 25}


def _budget(which: str):
    """``settings(max_examples=...)`` capped under the ci profile (the profile is loaded before collection)."""
    if profiles.current() != "ci":
        return lambda test: test
    return settings(max_examples=min(settings.default.max_examples, CI_EXAMPLES[which]))


@_budget("fused")
@given(case=compile_cases())
def test_fusion_fires_once_per_layer_and_matches_eager(case):
    _announce(case)
    check_fused(case)


DISABLED = ({"level": 1}, {"level": 2, "fuse_mla_rope_kvcache": False, "fuse_rope_kvcache": False},
            {"level": 3, "fuse_mla_rope_kvcache": False, "fuse_rope_kvcache": False})


@_budget("unfused")
@given(case=compile_cases(), disabled=st.sampled_from(DISABLED))
def test_no_fusion_below_o2_and_matches_eager(case, disabled):
    _announce(case)
    event(f"disabled by: {disabled}")
    check_unfused(case, **disabled)
