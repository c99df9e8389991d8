"""The compile-path model kit: toy models built from the public layers, the situations a
fusion pass must recognise and steps, shared by the compile-pass property,
the pass unit tests, the pass mutation self-test and ``benchmarks/bench_compile.py``.

Sizes stay small: on a CPU the kernels run through Triton's interpreter. Models, caches and steps
are built on the kernels' device (``running.devices.kernels_device``: CUDA when mla_fuse's kernels
run on the GPU in this process, else the CPU).

A model is described by a ``ModelSpec``: per layer its kind (``mla``/``mha``, so stacks may
be hybrid) and its *situation* (``layers``: ``plain``, ``pre_rotation_reader``,
``second_reader``, ``unsupported_rope``).

``shared_rope`` gives every layer of a kind the same rotary module (vLLM's ``get_rope``
caches one instance): the layers' ropes then read one cos/sin table with the same positions,
and a pattern could bind one layer's q to another layer's rope chain.

The kit is three modules, by what they hold: the layers and their ropes (``layers``), the
models, steps and runs (this module), what is inspected and compared of them (``inspection``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import mla_fuse.compile as mc  # not `compile`: Python's builtin
from mla_fuse.layers import LayerKVCache, RotaryEmbedding, set_forward_context
from mla_fuse_conformance.cases.engine_caches import CacheLayout, EngineCaches, MhaCacheSpec, MlaCacheSpec, build_caches
from mla_fuse_conformance.compile_passes.layers import LAYER_CLASSES, POSITIONS, InverseRope, make_rope
from mla_fuse_conformance.running.devices import kernels_device


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


READERS_OF_THE_BUFFER = ("second_reader", "second_split_reader")  # read the projection buffer after the rope


def build_model(spec: ModelSpec, use_custom_op: bool | None = None) -> ToyModel:
    """The spec's model with seeded weights, on the kernels' device. ``use_custom_op=True`` gives the
    eager reference: the unfused kernels, except in a layer of ``READERS_OF_THE_BUFFER``, whose reader
    sees the buffer the rope wrote in place (custom op) or left alone (native forms), so its reference
    keeps the spec's form."""
    torch.manual_seed(spec.seed)
    shared: dict = {}
    layers = []
    for name, kind, situation in zip(spec.layer_names, spec.kinds, spec.situations):
        custom = spec.rope == "custom_op" if use_custom_op is None or situation in READERS_OF_THE_BUFFER \
            else use_custom_op
        rope = _rope_for(spec, kind, situation, custom, shared)
        cls = LAYER_CLASSES[(kind, situation)]
        if kind == "mla":
            g = spec.mla
            layers.append(cls(spec.hidden, g.heads, g.nope, g.rope_dim, g.v_dim, g.latent, rope, name))
        else:
            g = spec.mha
            layers.append(cls(spec.hidden, g.heads, g.kv_heads, g.head_size, rope, name))
    return ToyModel(layers).to(device=kernels_device(), dtype=spec.torch_dtype)


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
    in ``[0, slots)``; tokens in ``padded`` get slot -1 in every layer, layers in ``unmapped`` none.
    Drawn on the CPU (the same values on every device), then moved to the kernels' device."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, spec.table_rows(), (tokens,), generator=generator)
    hidden = torch.randn(tokens, spec.hidden, generator=generator).to(spec.torch_dtype)
    slot_mapping = {}
    for i, name in enumerate(spec.layer_names):
        layer_slots = torch.randperm(slots, generator=generator)[:tokens]
        layer_slots[list(padded)] = -1
        slot_mapping[name] = None if i in unmapped else layer_slots
    device = kernels_device()
    return Step(positions.to(device), hidden.to(device),
                {name: None if slots_ is None else slots_.to(device) for name, slots_ in slot_mapping.items()})


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
    """Sentinel-filled caches of the fixed toy models (fp8 in uint8 storage), on the kernels' device."""
    spec = ModelSpec((kind,) * num_layers, ("plain",) * num_layers)
    storage = torch.uint8 if kv_cache_dtype.startswith("fp8") else dtype
    return build_caches(spec.cache_specs(), layout, blocks=BLOCKS, block_size=BLOCK_SIZE, dtype=storage,
                        kv_cache_dtype=kv_cache_dtype, device=kernels_device())


def toy_step(kind: str, num_layers: int, tokens: int, seed: int = 1) -> Step:
    """Random positions and hidden states; per layer distinct slots, the last token padded."""
    spec = ModelSpec((kind,) * num_layers, ("plain",) * num_layers)
    return make_step(spec, tokens, BLOCKS * BLOCK_SIZE, seed=seed, padded=(tokens - 1,))

