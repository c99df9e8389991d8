"""The five operations of CONTRACT §4, each declared once: its name and typed parameters, and
which parameters it writes.

Everything else that depends on a signature is derived from these declarations: the op's schema
and registration, its fake and the version bumps after a call (``mla_fuse.ops``); the public
wrapper's argument-type checks (from the registered schema, ``mla_fuse.ops``); and the checks
every call runs on all tensors at once, one device for every tensor argument and no overlap of
a written argument with any other (written = the parameters declared ``written``, read = the
other tensors; ``mla_fuse.validation``). A parameter added here reaches all of them
(``tests/test_signatures.py`` plants one). The per-operation rules of shapes and dtypes are
written out in ``mla_fuse.validation``, and the docstrings users read in ``mla_fuse.ops``'s
public wrappers (whose parameters are checked against these at import).

Imports nothing of mla_fuse: the modules that derive from it sit above it.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Optional

import torch

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One parameter: its name, its type as annotated (``Tensor``, ``Optional[Tensor]``, ``int``,
    ``bool``, ``str``) and whether the operation writes it (in place)."""

    name: str
    annotation: object
    written: bool = False

    @property
    def is_tensor(self) -> bool:
        return self.annotation in (Tensor, Optional[Tensor])

    @property
    def may_be_none(self) -> bool:
        return self.annotation == Optional[Tensor]


def written(name: str, annotation: object = Tensor) -> Parameter:
    """A parameter the operation writes in place (``Tensor(a!)`` in its schema)."""
    return Parameter(name, annotation, written=True)


@dataclasses.dataclass(frozen=True)
class Operation:
    """One operation of ``torch.ops.mla_fuse``.

    ``kernel_device``: the written tensor that names the device a kernel launch needs (the
    ``validation.require_kernel_device`` message). ``read_first``: read tensors the overlap check
    compares before the other read ones (the error names the first argument a written one
    overlaps; these are the ones most likely to share its buffer, a projection's other slice)."""

    name: str
    parameters: tuple[Parameter, ...]
    kernel_device: str
    read_first: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(parameter.name for parameter in self.parameters)

    def index(self, name: str) -> int:
        return self.names.index(name)

    @property
    def written(self) -> tuple[str, ...]:
        return tuple(parameter.name for parameter in self.parameters if parameter.written)

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every tensor parameter, in order (a device check's order)."""
        return tuple(parameter.name for parameter in self.parameters if parameter.is_tensor)

    @property
    def read(self) -> tuple[str, ...]:
        """The tensors only read, ``read_first`` first (an overlap check's order)."""
        others = tuple(name for name in self.tensors if name not in self.written and name not in self.read_first)
        return (*self.read_first, *others)

    def signature(self) -> inspect.Signature:
        """The typed signature the schema is inferred from (``torch.library.infer_schema``)."""
        return inspect.Signature([inspect.Parameter(parameter.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                    annotation=parameter.annotation)
                                  for parameter in self.parameters], return_annotation=None)


ROTARY_EMBEDDING = Operation("rotary_embedding", (
    Parameter("positions", Tensor), written("query"), written("key", Optional[Tensor]), Parameter("head_size", int),
    Parameter("cos_sin_cache", Tensor), Parameter("is_neox", bool),
), kernel_device="query")

CONCAT_AND_CACHE_MLA = Operation("concat_and_cache_mla", (
    Parameter("kv_c", Tensor), Parameter("k_pe", Tensor), written("kv_cache"), Parameter("slot_mapping", Tensor),
    Parameter("kv_cache_dtype", str), Parameter("scale", Tensor),
), kernel_device="kv_cache")

CONCAT_AND_CACHE_MLA_ROPE_FUSED = Operation("concat_and_cache_mla_rope_fused", (
    Parameter("positions", Tensor), written("q_pe"), written("k_pe"), Parameter("kv_c", Tensor),
    Parameter("cos_sin_cache", Tensor), Parameter("is_neox", bool), Parameter("slot_mapping", Tensor),
    written("kv_cache"), Parameter("kv_cache_dtype", str), Parameter("kv_cache_scale", Tensor),
), kernel_device="kv_cache", read_first=("kv_c",))

RESHAPE_AND_CACHE_FLASH = Operation("reshape_and_cache_flash", (
    Parameter("key", Tensor), Parameter("value", Tensor), written("key_cache"), written("value_cache"),
    Parameter("slot_mapping", Tensor), Parameter("kv_cache_dtype", str), Parameter("k_scale", Tensor),
    Parameter("v_scale", Tensor),
), kernel_device="key_cache")

ROPE_AND_RESHAPE_AND_CACHE_FLASH = Operation("rope_and_reshape_and_cache_flash", (
    Parameter("positions", Tensor), written("query"), written("key"), Parameter("value", Tensor),
    written("key_cache"), written("value_cache"), Parameter("slot_mapping", Tensor),
    Parameter("cos_sin_cache", Tensor), Parameter("is_neox", bool), Parameter("kv_cache_dtype", str),
    Parameter("k_scale", Tensor), Parameter("v_scale", Tensor),
), kernel_device="key_cache", read_first=("value",))

OPERATIONS = (ROTARY_EMBEDDING, CONCAT_AND_CACHE_MLA, CONCAT_AND_CACHE_MLA_ROPE_FUSED, RESHAPE_AND_CACHE_FLASH,
              ROPE_AND_RESHAPE_AND_CACHE_FLASH)
