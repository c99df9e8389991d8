"""The compile-path model kit: toy models built from the public layers, the situations a
fusion pass must recognise, steps, and the checks shared by the compile-pass properties,
the pass unit tests, the pass mutation self-test and ``benchmarks/bench_compile.py``.

Sizes stay small: the kernels run through Triton's interpreter on CPU.

A model is described by a ``ModelSpec``: per layer its kind (``mla``/``mha``, so stacks may
be hybrid) and its *situation*:

============================  ====================================================================
``plain``                     the layer as a serving engine writes it: fusion must fire (if allowed)
``pre_rotation_reader``       k (MLA ``k_pe``) is also used as it was before the rope: must not fuse
``second_reader``             the projection buffer q/k view (MHA ``qkv``, MLA ``q``/latent) is read
                              again after the rope: must not fuse (a fused in-place write, or
                              rewiring its users, would change what that reader sees)
``unsupported_rope``          the inverse rotation (sin flipped), a rope form no pattern covers
============================  ====================================================================

``shared_rope`` gives every layer of a kind the same rotary module (vLLM's ``get_rope``
caches one instance): the layers' ropes then read one cos/sin table with the same positions,
and a pattern could bind one layer's q to another layer's rope chain.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses

import torch
from torch import nn

import mla_fuse.compile as mc
from mla_fuse import ops
from mla_fuse.layers import (
    DeepseekScalingRotaryEmbedding, LayerKVCache, MHAAttention, MLAAttention, RotaryEmbedding, set_forward_context,
)
from mla_fuse.layers import unified_ops
from mla_fuse_conformance.cases.engine_caches import (  # noqa: F401  (SENTINEL: for the tests)
    SENTINEL, CacheLayout, EngineCaches, MhaCacheSpec, MlaCacheSpec, build_caches,
)

ROPE_FORMS = ("custom_op", "native", "deepseek_native")
SITUATIONS = ("plain", "pre_rotation_reader", "second_reader", "unsupported_rope")
POSITIONS = 64          # rows of a plain table; a DeepSeek table has POSITIONS // 4 * 4
YARN_FACTOR = 4.0

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


# ------------------------------------------------------------------ ropes


def make_rope(form: str, is_neox: bool, head_size: int, rotary_dim: int, *,
              use_custom_op: bool | None = None) -> RotaryEmbedding:
    """``custom_op``/``native``: plain table; ``deepseek_native``: YaRN table. ``use_custom_op``
    overrides the form's default (the eager reference calls the custom op whatever the form)."""
    custom = form == "custom_op" if use_custom_op is None else use_custom_op
    if form == "deepseek_native":
        return DeepseekScalingRotaryEmbedding(head_size, rotary_dim, POSITIONS // 4, 10000.0, is_neox, YARN_FACTOR,
                                              mscale=0.707, mscale_all_dim=0.707, use_custom_op=custom)
    return RotaryEmbedding(head_size, rotary_dim, POSITIONS, 10000.0, is_neox, use_custom_op=custom)


def inverse_rope(positions, query, key, cos_sin_cache, head_size: int, rotary_dim: int, is_neox: bool):
    """Not a supported form: ``a' = a*cos + b*sin``, ``b' = b*cos - a*sin`` on GPT-J pairs (the inverse
    rotation), in torch ops; ``is_neox`` is ignored."""
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)

    def rotate(x):
        parts = x.view(x.size(0), -1, head_size)
        a, b = parts[..., 0:rotary_dim:2].float(), parts[..., 1:rotary_dim:2].float()
        c, s = cos[:, None, :], sin[:, None, :]
        rotated = torch.stack([a * c + b * s, b * c - a * s], dim=-1).flatten(-2).to(x.dtype)
        return torch.cat([rotated, parts[..., rotary_dim:]], dim=-1).view(x.shape)

    return rotate(query), None if key is None else rotate(key)


class InverseRope(RotaryEmbedding):
    """``inverse_rope`` as a module (there is no kernel for it: always torch ops)."""

    def __init__(self, head_size: int, rotary_dim: int, is_neox: bool) -> None:
        super().__init__(head_size, rotary_dim, POSITIONS, 10000.0, is_neox, use_custom_op=False)

    def forward(self, positions, query, key=None):
        return inverse_rope(positions, query, key, self.cos_sin_cache, self.head_size, self.rotary_dim,
                            self.is_neox_style)


# ------------------------------------------------------------------ layers in each situation


def _plus(out: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """``out + read`` in fp32, rounded once (a same-dtype add after ``o_proj`` becomes an ``addmm``)."""
    return (out.float() + read.float()).to(out.dtype)


class PreRotationReaderMLA(MLAAttention):
    """k_pe before the rope is used after it (``k_pe_out = rotated - 2 * original``)."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        q, latent, kv_c, k_pe = self._project(hidden_states)
        k_pe_before = k_pe * 2
        k_pe = self._rotate(positions, q, k_pe)
        return self.update_and_attend(q, self.kv_a_layernorm(kv_c), k_pe), q, k_pe - k_pe_before

    def _project(self, hidden_states):
        q = self.q_proj(hidden_states).view(-1, self.num_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        latent = self.kv_a_proj_with_mqa(hidden_states)
        return (q, latent, *latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1))

    def _rotate(self, positions, q, k_pe):
        q_pe, k_pe = self.rotary_emb(positions, q[..., self.qk_nope_head_dim:], k_pe)
        if not self.rotary_emb.use_custom_op:
            q[..., self.qk_nope_head_dim:] = q_pe
        return k_pe


class SecondReaderMLA(PreRotationReaderMLA):
    """The latent projection ``[kv_c | k_pe]`` is read again after the rope: its last column (in
    ``k_pe``) joins the output."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        q, latent, kv_c, k_pe = self._project(hidden_states)
        k_pe = self._rotate(positions, q, k_pe)
        latent_read = latent[:, -1:]
        return _plus(self.update_and_attend(q, self.kv_a_layernorm(kv_c), k_pe), latent_read), q, k_pe


class PreRotationReaderMHA(MHAAttention):
    """k before the rope is used after it."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        qkv, (q, k, v) = self._project(hidden_states)
        k_before = k * 2
        q, k = self.rotary_emb(positions, q, k)
        return self.update_and_attend(q, k, v), q, k - k_before

    def _project(self, hidden_states):
        q_size, kv_size = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        qkv = self.qkv_proj(hidden_states)
        return qkv, qkv.split([q_size, kv_size, kv_size], dim=-1)


class SecondReaderMHA(PreRotationReaderMHA):
    """The packed ``qkv`` buffer is read again after the rope: its first column of k joins the output."""

    def forward_with_rope_outputs(self, positions, hidden_states):
        qkv, (q, k, v) = self._project(hidden_states)
        q, k = self.rotary_emb(positions, q, k)
        q_size = self.num_heads * self.head_size
        qkv_read = qkv[:, q_size:q_size + 1]
        return _plus(self.update_and_attend(q, k, v), qkv_read), q, k


LAYER_CLASSES = {
    ("mla", "plain"): MLAAttention, ("mla", "pre_rotation_reader"): PreRotationReaderMLA,
    ("mla", "second_reader"): SecondReaderMLA, ("mla", "unsupported_rope"): MLAAttention,
    ("mha", "plain"): MHAAttention, ("mha", "pre_rotation_reader"): PreRotationReaderMHA,
    ("mha", "second_reader"): SecondReaderMHA, ("mha", "unsupported_rope"): MHAAttention,
}


# ------------------------------------------------------------------ models


@dataclasses.dataclass(frozen=True)
class MlaGeometry:
    heads: int = 2
    nope: int = 8
    rope_dim: int = 8       # qk_rope_head_dim == rotary_dim == the rope's head size
    latent: int = 16        # kv_lora_rank
    v_dim: int = 8


@dataclasses.dataclass(frozen=True)
class MhaGeometry:
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 16
    rotary_dim: int = 16    # even, <= head_size (partial rotary when <)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A toy model; ``repr`` is valid Python with the names of this module imported."""

    kinds: tuple[str, ...] = ("mla",)
    situations: tuple[str, ...] = ("plain",)
    hidden: int = 32
    dtype: str = "bfloat16"
    is_neox: bool = False
    rope: str = "custom_op"         # ROPE_FORMS
    shared_rope: bool = False
    mla: MlaGeometry = MlaGeometry()
    mha: MhaGeometry = MhaGeometry()
    seed: int = 0

    @property
    def layer_names(self) -> list[str]:
        return [f"model.layers.{i}.attn" for i in range(len(self.kinds))]

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def cache_specs(self) -> dict[str, MlaCacheSpec | MhaCacheSpec]:
        return {name: MlaCacheSpec(self.mla.latent + self.mla.rope_dim) if kind == "mla"
                else MhaCacheSpec(self.mha.kv_heads, self.mha.head_size)
                for name, kind in zip(self.layer_names, self.kinds)}

    def table_rows(self) -> int:
        return POSITIONS // 4 * 4 if self.rope == "deepseek_native" else POSITIONS


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ToyModel(nn.Module):
    """Attention layers in sequence with residual connections; returns the output and each layer's
    rotated q and k. The residual add is done in fp32 and rounded once: Inductor rewrites a
    same-dtype ``mm + add`` into ``addmm`` (one rounding instead of two), which would make the
    compiled residual stream differ from eager for reasons that have nothing to do with the passes."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor):
        rotated = []
        for layer in self.layers:
            out, q, k = layer.forward_with_rope_outputs(positions, hidden)
            rotated += [q, k]
            hidden = (hidden.float() + out.float()).to(hidden.dtype)
        return hidden, rotated


def _rope_for(spec: ModelSpec, kind: str, situation: str, custom: bool, shared: dict) -> RotaryEmbedding:
    """The layer's rope; with ``shared_rope`` one module per kind and rope flavour (``custom``)."""
    head_size, rotary_dim = ((spec.mla.rope_dim, spec.mla.rope_dim) if kind == "mla"
                             else (spec.mha.head_size, spec.mha.rotary_dim))
    if situation == "unsupported_rope":
        return InverseRope(head_size, rotary_dim, spec.is_neox)
    if not spec.shared_rope:
        return make_rope(spec.rope, spec.is_neox, head_size, rotary_dim, use_custom_op=custom)
    if (kind, custom) not in shared:
        shared[kind, custom] = make_rope(spec.rope, spec.is_neox, head_size, rotary_dim, use_custom_op=custom)
    return shared[kind, custom]


def build_model(spec: ModelSpec, use_custom_op: bool | None = None) -> ToyModel:
    """The spec's model with seeded weights. ``use_custom_op=True`` gives the eager reference: the
    unfused kernels, except in a ``second_reader`` layer, whose reader sees the buffer the rope
    wrote in place (custom op) or left alone (native forms), so its reference keeps the spec's form."""
    torch.manual_seed(spec.seed)
    shared: dict = {}
    layers = []
    for name, kind, situation in zip(spec.layer_names, spec.kinds, spec.situations):
        custom = spec.rope == "custom_op" if use_custom_op is None or situation == "second_reader" else use_custom_op
        rope = _rope_for(spec, kind, situation, custom, shared)
        cls = LAYER_CLASSES[(kind, situation)]
        if kind == "mla":
            g = spec.mla
            layers.append(cls(spec.hidden, g.heads, g.nope, g.rope_dim, g.v_dim, g.latent, rope, name))
        else:
            g = spec.mha
            layers.append(cls(spec.hidden, g.heads, g.kv_heads, g.head_size, rope, name))
    return ToyModel(layers).to(spec.torch_dtype)


def same_weights(model: ToyModel, other: ToyModel) -> ToyModel:
    other.load_state_dict(model.state_dict())
    return other


# ------------------------------------------------------------------ steps and runs


@dataclasses.dataclass
class Step:
    positions: torch.Tensor
    hidden: torch.Tensor
    slot_mapping: dict[str, torch.Tensor | None]


def make_step(spec: ModelSpec, tokens: int, slots: int, *, seed: int, padded=(), unmapped=()) -> Step:
    """Positions anywhere in the table (last row included), hidden states, per layer distinct slots
    in ``[0, slots)``; tokens in ``padded`` get slot -1 in every layer, layers in ``unmapped`` none."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, spec.table_rows(), (tokens,), generator=generator)
    hidden = torch.randn(tokens, spec.hidden, generator=generator).to(spec.torch_dtype)
    slot_mapping = {}
    for i, name in enumerate(spec.layer_names):
        layer_slots = torch.randperm(slots, generator=generator)[:tokens]
        layer_slots[list(padded)] = -1
        slot_mapping[name] = None if i in unmapped else layer_slots
    return Step(positions, hidden, slot_mapping)


def run(model, caches: dict[str, LayerKVCache], step: Step, *, dynamic: bool = False):
    """One forward step; returns clones of the output and of every layer's rotated q and k."""
    positions, hidden = step.positions, step.hidden
    if dynamic:  # as engines compile: one graph for every token count >= 2
        positions, hidden = positions.clone(), hidden.clone()
        torch._dynamo.mark_dynamic(positions, 0)
        torch._dynamo.mark_dynamic(hidden, 0)
    with torch.no_grad(), set_forward_context(caches, step.slot_mapping):
        output, rotated = model(positions, hidden)
    return output.clone(), [t.clone() for t in rotated]


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
    from mla_fuse.passes.fx_utils import call_args
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


def compile_light(model, **kwargs):
    torch._dynamo.reset()
    return mc.compile(model, backend="light", **kwargs)


# ------------------------------------------------------------------ the fixed toy models of the unit tests


def mla_model(num_layers: int = 2, form: str = "custom_op", is_neox: bool = False, dtype=torch.bfloat16,
              seed: int = 0, use_custom_op: bool | None = None, situation: str = "plain") -> ToyModel:
    spec = ModelSpec(("mla",) * num_layers, (situation,) * num_layers, dtype=str(dtype).split(".")[-1],
                     is_neox=is_neox, rope=form, seed=seed)
    return build_model(spec, use_custom_op)


def mha_model(num_layers: int = 2, form: str = "custom_op", is_neox: bool = True, dtype=torch.bfloat16,
              seed: int = 0, rotary_dim: int = 16, use_custom_op: bool | None = None,
              situation: str = "plain") -> ToyModel:
    spec = ModelSpec(("mha",) * num_layers, (situation,) * num_layers, dtype=str(dtype).split(".")[-1],
                     is_neox=is_neox, rope=form, seed=seed, mha=MhaGeometry(rotary_dim=rotary_dim))
    return build_model(spec, use_custom_op)


BLOCKS, BLOCK_SIZE = 8, 4


def toy_caches(kind: str, num_layers: int, kv_cache_dtype: str = "auto", dtype=torch.bfloat16,
               layout: CacheLayout = CacheLayout("separate", "split")) -> EngineCaches:
    """Sentinel-filled caches of the fixed toy models (fp8 in uint8 storage)."""
    spec = ModelSpec((kind,) * num_layers, ("plain",) * num_layers)
    storage = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    return build_caches(spec.cache_specs(), layout, blocks=BLOCKS, block_size=BLOCK_SIZE, dtype=storage,
                        kv_cache_dtype=kv_cache_dtype)


def toy_step(kind: str, num_layers: int, tokens: int, seed: int = 1) -> Step:
    """Random positions and hidden states; per layer distinct slots, the last token padded."""
    spec = ModelSpec((kind,) * num_layers, ("plain",) * num_layers)
    return make_step(spec, tokens, BLOCKS * BLOCK_SIZE, seed=seed, padded=(tokens - 1,))


def assert_same_results(result, expected, caches: EngineCaches, expected_caches: EngineCaches) -> None:
    """Output, every layer's q and k and every byte of every cache pool, bit for bit."""
    from mla_fuse_conformance.cases.engine_caches import pools_bitwise_equal

    problems = result_differences(result, expected) + pools_bitwise_equal(caches, expected_caches)
    assert not problems, "\n".join(problems)

