"""The forward context: per-step state the attention layers read by layer name.

A model's attention layers do not take their paged caches or the step's slot
mapping as arguments (the signature torch.compile sees stays stable from step
to step). Instead the caller enters ``set_forward_context`` around the model
call, and each layer looks itself up by its ``layer_name``:

* at trace time the layer reads its ``kv_cache_dtype`` (and, MLA, ``k_scale``) and
  passes them to the cache-update op: the format becomes a literal of the compiled
  graph (dynamo guards on it), the scale a graph input;
* at run time the update and attention ops read the layer's cache tensor(s), the
  step's slot mapping and the attended slots from the context. The caches never
  enter a compiled graph, so a graph never copies them, however they alias (views
  of one engine-owned pool; see ``unified_ops``).

``slot_mapping`` maps layer name to a 1-D int tensor (``-1`` = padding) or
``None``; a layer absent from it, or mapped to ``None``, writes nothing this
step (the fused op then only rotates q and k). ``context_slots`` are the cache
slots the (single-sequence, non-causal) reference attention reads; ``None``
means the valid slots of the layer's own slot mapping.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Mapping

import torch


@dataclasses.dataclass
class LayerKVCache:
    """One attention layer's paged cache(s) and how values are stored in them.

    MLA layers set ``kv_cache [NB, B, L + R]``; MHA layers set
    ``key_cache [NB, B, Hkv, D]`` and ``value_cache [NB, B, Hkv, Dv]``.
    ``k_scale``/``v_scale`` are fp32 tensors (``[1]``, or ``[Hkv]`` for MHA),
    used only by fp8 caches (CONTRACT §3).
    """

    kv_cache_dtype: str = "auto"
    kv_cache: torch.Tensor | None = None
    key_cache: torch.Tensor | None = None
    value_cache: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        device = next((t.device for t in (self.kv_cache, self.key_cache) if t is not None), torch.device("cpu"))
        if self.k_scale is None:
            self.k_scale = torch.ones(1, dtype=torch.float32, device=device)
        if self.v_scale is None:
            self.v_scale = torch.ones(1, dtype=torch.float32, device=device)


@dataclasses.dataclass
class ForwardContext:
    """Everything the layers of one forward step look up by layer name."""

    layers: Mapping[str, LayerKVCache]
    slot_mapping: Mapping[str, torch.Tensor | None] = dataclasses.field(default_factory=dict)
    context_slots: torch.Tensor | None = None

    def layer(self, layer_name: str) -> LayerKVCache:
        """The cache entry of ``layer_name``; an unknown name is an error naming the known ones."""
        entry = self.layers.get(layer_name)
        if entry is None:
            raise KeyError(
                f"forward context: unknown layer name {layer_name!r}; "
                f"the context holds caches for {sorted(self.layers)}"
            )
        return entry

    def slot_mapping_for(self, layer_name: str) -> torch.Tensor | None:
        """The step's slot mapping of a known layer, or ``None`` (write nothing)."""
        self.layer(layer_name)
        return self.slot_mapping.get(layer_name)

    def attended_slots(self, layer_name: str) -> torch.Tensor | None:
        """Slots the reference attention of ``layer_name`` reads (``None``: nothing cached)."""
        if self.context_slots is not None:
            return self.context_slots
        slot_mapping = self.slot_mapping_for(layer_name)
        if slot_mapping is None:
            return None
        return slot_mapping[slot_mapping >= 0]


_CURRENT: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    """The context entered by the innermost ``set_forward_context``."""
    if _CURRENT is None:
        raise RuntimeError(
            "no forward context: call the model inside `with set_forward_context(...)` "
            "(mla_fuse.layers.forward_context)"
        )
    return _CURRENT


@contextlib.contextmanager
def set_forward_context(
    layers: Mapping[str, LayerKVCache],
    slot_mapping: Mapping[str, torch.Tensor | None] | None = None,
    context_slots: torch.Tensor | None = None,
) -> Iterator[ForwardContext]:
    """Make a ``ForwardContext`` current for the duration of the block (nests)."""
    global _CURRENT
    previous = _CURRENT
    _CURRENT = ForwardContext(dict(layers), dict(slot_mapping or {}), context_slots)
    try:
        yield _CURRENT
    finally:
        _CURRENT = previous
