"""What the checkers remember of the layouts they passed, and the slot where a layout's launch plan
is kept.

The sync-free verdict of a checker (``mla_fuse.validation``) depends only on the arguments'
metadata, so each checker remembers the layouts it passed (addresses, sizes, strides, dtypes,
devices of the tensors and the other arguments as given, up to ``KNOWN_LAYOUTS_PER_OPERATION`` of
them): a serving loop that calls an operation on the same buffers again pays for building that
key, not for the checks. Of the checks only the overlap of written buffers reads addresses, so a
layout whose shapes (everything but the addresses) a checker passed before, at other addresses,
runs that check alone: the layers of one step after the first (each its own cache, the same
activations' shapes).

A checker called without value checks returns the layout's *slot*, a one-element list that lives
as long as the layout is remembered (None when it is not): the op hands it to its launch, which
keeps there what it derives from the layout (``mla_fuse.kernels.config.planned``), so a call on
known buffers computes neither the checks nor the launch's sizes, strides and configuration again.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

KNOWN_LAYOUTS_PER_OPERATION = 1024

_KNOWN_LAYOUTS: dict[str, dict[tuple, list]] = {}  # checker name -> layouts it passed -> each one's slot
_KNOWN_SHAPES: dict[str, set] = {}  # checker name -> the address-free parts of those layouts


def forget_layouts() -> None:
    """Forget every layout the checkers passed (the next call of each checks again)."""
    for known in (*_KNOWN_LAYOUTS.values(), *_KNOWN_SHAPES.values()):
        known.clear()


def _layout_key(args: tuple) -> tuple:
    """Everything the sync-free checks read, as ``(shapes, addresses)``: ``shapes`` holds each tensor's
    sizes, strides, dtype and device and every other argument with its type (``True`` is not ``1``),
    ``addresses`` each tensor's address. Raises ``RuntimeError`` for a tensor without storage; hashing
    the key raises ``TypeError`` for an unhashable argument.

    Its cost is a known layout's whole cost, so it is built the cheapest way measured (one loop, one
    hash; the forms tried and their costs: docs/INPUTS.md, "What a call costs on the host")."""
    shapes, addresses = [], []
    for value in args:
        if isinstance(value, torch.Tensor):
            shapes.append((value.shape, value.stride(), value.dtype, value.device))
            addresses.append(value.data_ptr())
        else:
            shapes.append((type(value), value))
    return tuple(shapes), tuple(addresses)


def remembering(checker: Callable, names: tuple[str, ...], overlap_checker: Callable,
                values_checked: Callable[[bool | None], bool]) -> Callable:
    """``checker(*args, check_values=...)``, made to skip what it checked before: a layout it passed
    (the same key, ``_layout_key``) returns that layout's slot (module docstring) without checking;
    a layout whose shapes it passed at other addresses (another layer's cache, the same step's
    activations) runs only ``overlap_checker(*args)``, the one check that reads addresses. When
    ``values_checked(check_values)`` it always runs in full and returns None. ``names``: the
    parameters, in order (arguments may come by position or by name)."""
    known = _KNOWN_LAYOUTS.setdefault(checker.__name__, {})
    shapes_known = _KNOWN_SHAPES.setdefault(checker.__name__, set())

    @functools.wraps(checker)
    def check(*args, check_values: bool | None = None, **named) -> list | None:
        if named:
            args = (*args, *(named.pop(name) for name in names[len(args):] if name in named))
        if named or len(args) != len(names):
            checker(*args, **named, check_values=check_values)  # raises the TypeError of a wrong call
            return None
        if values_checked(check_values):
            checker(*args, check_values=True)
            return None
        try:
            key = _layout_key(args)
            slot = known.get(key)  # hashed once: the lookup is the only hash on a hit
            if slot is not None:
                return slot
            shapes_passed = key[0] in shapes_known
        except (TypeError, RuntimeError):  # an unhashable argument, a tensor without storage: no key
            key, shapes_passed = None, False
        if shapes_passed:
            overlap_checker(*args)
        else:
            checker(*args, check_values=False)
        if key is None:
            return None
        if len(known) >= KNOWN_LAYOUTS_PER_OPERATION:
            known.clear()  # start over (atomic: calls from several threads stay safe)
            shapes_known.clear()
        shapes_known.add(key[0])
        slot = known[key] = [None]
        return slot

    return check
