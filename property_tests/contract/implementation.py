"""Implementations of the contract, and how the suite picks one.

An *implementation* is any object that provides some of the five in-place
callables of CONTRACT §4 (``OPERATIONS``) plus a few declarations:

``name``           a label for reports (default: the class name)
``rounding``       ``"single"`` (fp32 math, one rounding; the default) or
                   ``"per_op"`` (rounds after every operation; wider bound, CONTRACT §5)
``padded_rows``    what happens to rows whose slot is negative or past a short
                   ``slot_mapping``: ``"rotated"`` (q and k rotated; default),
                   ``"q_only"`` (k left unrotated) or ``"skipped"`` (neither)
``checks_inputs``  whether bad input raises before any write (CONTRACT §4);
                   only then do the suite's bad-input properties apply (default False)
``capabilities``   the inputs it supports (``capabilities.Capabilities``; default: the whole contract)
``required``       operations that must be provided: a missing one fails instead of being
                   skipped (``--require OP[,OP]`` adds to it)

A SPEC names one: a registered name (``triton``, ``reference``, ``vllm``, ``flashinfer``,
``sglang``, the mutants ``mutant:NAME``), or ``module.path:attr`` for any importable module
(the current directory is importable); a class is instantiated with no arguments.
``MLA_FUSE_IMPL`` is the fallback when no SPEC is given. A SPEC that cannot be loaded raises
``ImplementationError`` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import sys
from typing import Any, Callable

from mla_fuse_conformance.contract.capabilities import Capabilities, from_declaration
from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS, OPERATIONS, PADDED_ROW_MODES, ROUNDING_MODES

__all__ = ["OPERATION_ARGUMENTS", "OPERATIONS", "Capabilities", "Implementation", "ImplementationError", "describe",
           "load_implementation", "parse_required", "registered_names", "resolve_spec"]

IMPL_ENV_VAR = "MLA_FUSE_IMPL"
DEFAULT_IMPL = "triton"

# Names that resolve to specs, lazily: nothing is imported until that implementation is chosen
# (``mutant:NAME`` resolves through MUTANTS_MODULE, see ``_mutant_specs``).
BUILT_IN: dict[str, str] = {
    "reference": "mla_fuse_reference.adapter:ReferenceImplementation",
    "triton": "mla_fuse_conformance.adapters.triton:TritonImplementation",
    "triton-cpu-fast": "mla_fuse_conformance.adapters.triton_cpu_fast:TritonCpuFastImplementation",
    "vllm": "mla_fuse_conformance.adapters.vllm:VllmImplementation",
    "vllm-cpu-amx": "mla_fuse_conformance.adapters.vllm:VllmCpuAmxImplementation",
    "flashinfer": "mla_fuse_conformance.adapters.flashinfer:FlashInferImplementation",
    "sglang": "mla_fuse_conformance.adapters.sglang:SglangImplementation",
}


def registered_names() -> list[str]:
    return sorted({**BUILT_IN, **_mutant_specs()})


class ImplementationError(ValueError):
    """The implementation cannot be loaded or its declarations are invalid (a one-line message)."""


@dataclasses.dataclass(frozen=True)
class Implementation:
    """A loaded implementation with its declarations read and checked."""

    spec: str
    name: str
    rounding: str
    padded_rows: str
    checks_inputs: bool
    target: Any  # the object that provides the callables
    capabilities: dict = dataclasses.field(default_factory=lambda: from_declaration(None, "<default>"))
    required: tuple[str, ...] = ()
    near_misses: dict = dataclasses.field(default_factory=dict)  # attribute -> the operation it resembles

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

    @property
    def missing_required(self) -> tuple[str, ...]:
        return tuple(op for op in self.required if not self.provides(op))

    def caps(self, operation: str) -> Capabilities:
        return self.capabilities[operation]


MUTANTS_MODULE = "mla_fuse_conformance.mutants.kernels"
PASS_MUTANTS_MODULE = "mla_fuse_conformance.compile_passes.mutants"


def pass_mutants() -> dict:
    """The compile-pass mutants by name (``compile_passes.mutants.PASS_MUTANTS``), loaded by name like the
    kernel mutants (only when one is planted)."""
    return importlib.import_module(PASS_MUTANTS_MODULE).PASS_MUTANTS


def _mutant_specs() -> dict[str, str]:
    """``mutant:NAME`` -> its spec, for every mutant (imported only when a mutant is asked for or names are listed)."""
    mutants = importlib.import_module(MUTANTS_MODULE)
    return {f"mutant:{name}": f"{MUTANTS_MODULE}:{cls.__name__}" for name, cls in mutants.MUTANTS.items()}


def resolve_spec(spec: str | None) -> str:
    """The SPEC to load: the argument, else ``$MLA_FUSE_IMPL``, else the default."""
    return spec or os.environ.get(IMPL_ENV_VAR) or DEFAULT_IMPL


def parse_required(text: str | None) -> tuple[str, ...]:
    """``--require OP[,OP]`` -> operation names, each checked against the contract."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    unknown = [name for name in names if name not in OPERATIONS]
    if unknown:
        raise ImplementationError(f"--require: {', '.join(unknown)} not an operation of the contract; "
                                  f"expected some of {', '.join(OPERATIONS)}")
    return names


def load_implementation(spec: str | None = None, require: tuple[str, ...] = ()) -> Implementation:
    """Load the implementation named by ``spec`` (see the module docstring)."""
    spec = resolve_spec(spec)
    target_spec = BUILT_IN.get(spec) or (_mutant_specs().get(spec) if spec.startswith("mutant:") else None) or spec
    if ":" not in target_spec:
        raise ImplementationError(f"--impl: {spec!r} is neither a registered name ({', '.join(registered_names())}) "
                                  "nor a 'module.path:attr' spec")
    module_name, _, attr = target_spec.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the user's adapter next to where they run, as `python -m` has it
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is reported in one line
        raise ImplementationError(f"--impl {spec}: cannot import module {module_name!r}: "
                                  f"{type(error).__name__}: {_first_line(error)}") from error
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ImplementationError(f"--impl {spec}: module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(target, type):
        try:
            target = target()
        except Exception as error:  # noqa: BLE001 - e.g. an adapter whose library is not installed
            raise ImplementationError(f"--impl {spec}: {attr}() failed: {type(error).__name__}: "
                                      f"{_first_line(error)}") from error
    return describe(target, spec, require)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def describe(target: Any, spec: str = "<object>", require: tuple[str, ...] = ()) -> Implementation:
    """Read and check the declarations of an implementation object."""
    rounding = getattr(target, "rounding", "single")
    padded_rows = getattr(target, "padded_rows", "rotated")
    checks_inputs = getattr(target, "checks_inputs", False)
    if rounding not in ROUNDING_MODES:
        raise ImplementationError(f"implementation {spec!r}: rounding must be one of {ROUNDING_MODES}, "
                                  f"got {rounding!r}")
    if padded_rows not in PADDED_ROW_MODES:
        raise ImplementationError(f"implementation {spec!r}: padded_rows must be one of {PADDED_ROW_MODES}, "
                                  f"got {padded_rows!r}")
    if not isinstance(checks_inputs, bool):
        raise ImplementationError(f"implementation {spec!r}: checks_inputs must be a bool, got {checks_inputs!r}")
    try:
        capabilities = from_declaration(getattr(target, "capabilities", None), spec)
    except (TypeError, ValueError) as error:
        raise ImplementationError(str(error)) from error
    required = tuple(dict.fromkeys((*parse_required(",".join(getattr(target, "required", ()) or ())), *require)))
    name = getattr(target, "name", None) or type(target).__name__
    impl = Implementation(spec, name, rounding, padded_rows, checks_inputs, target, capabilities, required,
                          near_misses(target))
    if not impl.operations:
        hint = "".join(f"; {attr!r} looks like {op!r}" for attr, op in impl.near_misses.items())
        raise ImplementationError(f"implementation {spec!r} provides none of the operations "
                                  f"{', '.join(OPERATIONS)}{hint}")
    return impl


def near_misses(target: Any) -> dict[str, str]:
    """Callable attributes whose names are close to an operation's but are not one (misspellings)."""
    found = {}
    for attr in dir(target):
        if attr.startswith("_") or attr in OPERATIONS or not callable(getattr(target, attr, None)):
            continue
        close = difflib.get_close_matches(attr, OPERATIONS, n=1, cutoff=0.8)
        if close:
            found[attr] = close[0]
    return found
