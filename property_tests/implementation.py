"""Implementations of the contract, and how the suite picks one.

An *implementation* is any object that provides some of the five in-place
callables of CONTRACT §4 (``OPERATIONS``) plus a few declared properties:

``name``           a label for reports (default: the class name)
``rounding``       ``"single"`` (fp32 math, one rounding; the default) or
                   ``"per_op"`` (rounds after every operation; wider bound, CONTRACT §5)
``padded_rows``    what happens to rows whose slot is negative or past a short
                   ``slot_mapping``: ``"rotated"`` (q and k rotated; default),
                   ``"q_only"`` (k left unrotated) or ``"skipped"`` (neither)
``checks_inputs``  whether bad input raises before any write (CONTRACT §4);
                   only then do the suite's bad-input properties apply (default False)

A SPEC names one: a registered name (``reference``, ``triton``, the mutants),
or ``module.path:attr`` for any importable module; a class is instantiated
with no arguments. ``MLA_FUSE_IMPL`` is the fallback when no SPEC is given.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Callable

from mla_fuse_conformance.protocol import OPERATION_ARGUMENTS, OPERATIONS, PADDED_ROW_MODES, ROUNDING_MODES

__all__ = ["OPERATION_ARGUMENTS", "OPERATIONS", "Implementation", "describe", "load_implementation", "register",
           "registered_names", "resolve_spec"]

IMPL_ENV_VAR = "MLA_FUSE_IMPL"
DEFAULT_IMPL = "triton"

# Registered names resolve lazily to specs: nothing is imported until that implementation is chosen.
_REGISTRY: dict[str, str] = {
    "reference": "mla_fuse_reference.adapter:ReferenceImplementation",
    "triton": "mla_fuse_conformance.adapters.triton:TritonImplementation",
    "triton-cpu-fast": "mla_fuse_conformance.adapters.triton_cpu_fast:TritonCpuFastImplementation",
}


def register(name: str, spec: str) -> None:
    """Make ``name`` resolve to ``spec`` (``module.path:attr``)."""
    if ":" not in spec:
        raise ValueError(f"register: spec must look like 'module.path:attr', got {spec!r}")
    _REGISTRY[name] = spec


def registered_names() -> list[str]:
    _register_mutants()
    return sorted(_REGISTRY)


@dataclasses.dataclass(frozen=True)
class Implementation:
    """A loaded implementation with its declarations read and checked."""

    spec: str
    name: str
    rounding: str
    padded_rows: str
    checks_inputs: bool
    target: Any  # the object that provides the callables

    def provides(self, operation: str) -> bool:
        return callable(getattr(self.target, operation, None))

    def op(self, operation: str) -> Callable[..., None]:
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; expected one of {OPERATIONS}")
        fn = getattr(self.target, operation, None)
        if not callable(fn):
            raise AttributeError(f"implementation {self.name!r} does not provide {operation}")
        return fn

    @property
    def operations(self) -> tuple[str, ...]:
        return tuple(op for op in OPERATIONS if self.provides(op))


MUTANTS_MODULE = "mla_fuse_conformance.mutants"


def _register_mutants() -> None:
    """``mutant:NAME`` for every mutant (imported only when a mutant is asked for or names are listed)."""
    mutants = importlib.import_module(MUTANTS_MODULE)
    for mutant_name, cls in mutants.MUTANTS.items():
        _REGISTRY.setdefault(f"mutant:{mutant_name}", f"{MUTANTS_MODULE}:{cls.__name__}")


def resolve_spec(spec: str | None) -> str:
    """The SPEC to load: the argument, else ``$MLA_FUSE_IMPL``, else the default."""
    return spec or os.environ.get(IMPL_ENV_VAR) or DEFAULT_IMPL


def load_implementation(spec: str | None = None) -> Implementation:
    """Load the implementation named by ``spec`` (see the module docstring)."""
    spec = resolve_spec(spec)
    if spec not in _REGISTRY and spec.startswith("mutant:"):
        _register_mutants()
    target_spec = _REGISTRY.get(spec, spec)
    if ":" not in target_spec:
        raise ValueError(
            f"--impl: {spec!r} is neither a registered name ({', '.join(registered_names())}) "
            "nor a 'module.path:attr' spec"
        )
    module_name, _, attr = target_spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"--impl: cannot import module {module_name!r} of {spec!r}: {error}") from error
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"--impl: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, type):
        target = target()
    return describe(target, spec)


def describe(target: Any, spec: str = "<object>") -> Implementation:
    """Read and check the declarations of an implementation object."""
    rounding = getattr(target, "rounding", "single")
    padded_rows = getattr(target, "padded_rows", "rotated")
    checks_inputs = getattr(target, "checks_inputs", False)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"implementation {spec!r}: rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
    if padded_rows not in PADDED_ROW_MODES:
        raise ValueError(
            f"implementation {spec!r}: padded_rows must be one of {PADDED_ROW_MODES}, got {padded_rows!r}"
        )
    if not isinstance(checks_inputs, bool):
        raise TypeError(f"implementation {spec!r}: checks_inputs must be a bool, got {checks_inputs!r}")
    name = getattr(target, "name", None) or type(target).__name__
    impl = Implementation(spec, name, rounding, padded_rows, checks_inputs, target)
    if not impl.operations:
        raise ValueError(f"implementation {spec!r} provides none of the operations {OPERATIONS}")
    return impl
