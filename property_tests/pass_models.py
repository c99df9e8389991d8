"""Toy models and checks shared by the ``test_passes_*`` files (no tests here).

Sizes stay small: the kernels run through Triton's interpreter on CPU.
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

HIDDEN, HEADS, NOPE, ROPE, LATENT, V_DIM = 32, 2, 8, 8, 16, 8
MHA_HEADS, MHA_KV_HEADS, MHA_HEAD = 4, 2, 16
BLOCKS, BLOCK_SIZE, POSITIONS = 8, 4, 64
SENTINEL = 0x5A

ROPE_FORMS = ("custom_op", "native", "deepseek_native")


def make_rope(form: str, is_neox: bool, head_size: int, rotary_dim: int, *, use_custom_op: bool | None = None):
    custom = form == "custom_op" if use_custom_op is None else use_custom_op
    if form == "deepseek_native":
        return DeepseekScalingRotaryEmbedding(head_size, rotary_dim, POSITIONS // 4, 10000.0, is_neox, 4.0,
                                              mscale=0.707, mscale_all_dim=0.707, use_custom_op=custom)
    return RotaryEmbedding(head_size, rotary_dim, POSITIONS, 10000.0, is_neox, use_custom_op=custom)


class ToyModel(nn.Module):
    """Attention layers in sequence (residual); returns the output and each layer's rotated q and k."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor):
        rotated = []
        for layer in self.layers:
            out, q, k = layer.forward_with_rope_outputs(positions, hidden)
            rotated += [q, k]
            hidden = hidden + out
        return hidden, rotated


def mla_model(num_layers: int = 2, form: str = "custom_op", is_neox: bool = False, dtype=torch.bfloat16,
              seed: int = 0, use_custom_op: bool | None = None, layer_cls=MLAAttention, rope_cls=None) -> ToyModel:
    torch.manual_seed(seed)
    layers = []
    for i in range(num_layers):
        rope = rope_cls(ROPE, ROPE, POSITIONS, 10000.0, is_neox) if rope_cls else \
            make_rope(form, is_neox, ROPE, ROPE, use_custom_op=use_custom_op)
        layers.append(layer_cls(HIDDEN, HEADS, NOPE, ROPE, V_DIM, LATENT, rope, f"model.layers.{i}.attn"))
    return ToyModel(layers).to(dtype)


def mha_model(num_layers: int = 2, form: str = "custom_op", is_neox: bool = True, dtype=torch.bfloat16,
              seed: int = 0, rotary_dim: int = MHA_HEAD, use_custom_op: bool | None = None) -> ToyModel:
    torch.manual_seed(seed)
    layers = [MHAAttention(HIDDEN, MHA_HEADS, MHA_KV_HEADS, MHA_HEAD,
                           make_rope(form, is_neox, MHA_HEAD, rotary_dim, use_custom_op=use_custom_op),
                           f"model.layers.{i}.attn") for i in range(num_layers)]
    return ToyModel(layers).to(dtype)


def same_weights(model: ToyModel, other: ToyModel) -> ToyModel:
    other.load_state_dict(model.state_dict())
    return other


def _filled(shape, dtype) -> torch.Tensor:
    """A cache pre-filled with a sentinel byte pattern (never zeros)."""
    size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return torch.full((size,), SENTINEL, dtype=torch.uint8).view(dtype).view(shape)


def mla_caches(num_layers: int, kv_cache_dtype: str = "auto", dtype=torch.bfloat16) -> dict[str, LayerKVCache]:
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    return {f"model.layers.{i}.attn": LayerKVCache(
        kv_cache_dtype, kv_cache=_filled((BLOCKS, BLOCK_SIZE, LATENT + ROPE), cache_dtype),
        k_scale=torch.tensor([0.05 * (i + 1)], dtype=torch.float32)) for i in range(num_layers)}


def mha_caches(num_layers: int, kv_cache_dtype: str = "auto", dtype=torch.bfloat16) -> dict[str, LayerKVCache]:
    cache_dtype = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    shape = (BLOCKS, BLOCK_SIZE, MHA_KV_HEADS, MHA_HEAD)
    return {f"model.layers.{i}.attn": LayerKVCache(
        kv_cache_dtype, key_cache=_filled(shape, cache_dtype), value_cache=_filled(shape, cache_dtype),
        k_scale=torch.tensor([0.05 * (i + 1)], dtype=torch.float32),
        v_scale=torch.tensor([0.03 * (i + 1)], dtype=torch.float32)) for i in range(num_layers)}


@dataclasses.dataclass
class Step:
    positions: torch.Tensor
    hidden: torch.Tensor
    slot_mapping: dict[str, torch.Tensor | None]


def make_step(num_tokens: int, layer_names, seed: int = 1, dtype=torch.bfloat16, pad_last: bool = True) -> Step:
    """Random positions and hidden states; per layer a distinct slot mapping (last token padded)."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, POSITIONS // 4 * 4 - 1, (num_tokens,), generator=generator)
    hidden = torch.randn(num_tokens, HIDDEN, generator=generator).to(dtype)
    slot_mapping = {}
    for name in layer_names:
        slots = torch.randperm(BLOCKS * BLOCK_SIZE, generator=generator)[:num_tokens]
        if pad_last:
            slots[-1] = -1
        slot_mapping[name] = slots
    return Step(positions, hidden, slot_mapping)


def run(model, caches: dict[str, LayerKVCache], step: Step):
    with torch.no_grad(), set_forward_context(caches, step.slot_mapping):
        hidden, rotated = model(step.positions, step.hidden)
    return hidden.clone(), [t.clone() for t in rotated]


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    a, e = actual.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8)
    assert torch.equal(a, e), f"{what}: {(a != e).sum().item()} bytes differ"


def assert_same_results(result, expected, caches, expected_caches, *, output_exact: bool = True) -> None:
    """q, k and every cache bit for bit; the model output too unless Inductor generated its code."""
    if output_exact:
        assert_bitwise(result[0], expected[0], "model output")
    else:
        torch.testing.assert_close(result[0], expected[0], rtol=2e-2, atol=2e-2, msg="model output")
    for i, (a, e) in enumerate(zip(result[1], expected[1])):
        assert_bitwise(a, e, f"layer {i // 2} {'q' if i % 2 == 0 else 'k'} after rope")
    for name in caches:
        for field in ("kv_cache", "key_cache", "value_cache"):
            if getattr(caches[name], field) is not None:
                assert_bitwise(getattr(caches[name], field), getattr(expected_caches[name], field),
                               f"{name}.{field}")


def clone_caches(caches: dict[str, LayerKVCache]) -> dict[str, LayerKVCache]:
    return {name: dataclasses.replace(entry, **{f: getattr(entry, f).clone() for f in
                                              ("kv_cache", "key_cache", "value_cache") if getattr(entry, f) is not None})
            for name, entry in caches.items()}


# ------------------------------------------------------------------ graph checks

def final_graph(compiled) -> torch.fx.Graph:
    return compiled.mla_fuse_backend.graphs[-1].graph


def count_calls(graph: torch.fx.Graph, op) -> int:
    """Nodes calling ``op`` directly or through ``auto_functionalized``."""
    return sum(1 for n in graph.nodes if n.op == "call_function" and (
        n.target is op or (n.target is torch.ops.higher_order.auto_functionalized and n.args[0] is op)))


ROTARY = torch.ops.mla_fuse.rotary_embedding.default
SLICE_SCATTER = torch.ops.aten.slice_scatter.default


def count_slice_scatters(graph: torch.fx.Graph) -> int:
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target is SLICE_SCATTER)


def native_rope_nodes(graph: torch.fx.Graph) -> int:
    """``index`` of a cos/sin table: the first op of a native rope."""
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target in (
        torch.ops.aten.index.Tensor, torch.ops.aten.index_select.default))


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


FUSED_MLA = unified_ops.FUSED_MLA_UPDATE
UNIFIED_MLA = unified_ops.UNIFIED_MLA_UPDATE
FUSED_MHA = unified_ops.FUSED_UPDATE
UNIFIED_MHA = unified_ops.UNIFIED_UPDATE
