"""What the user may have meant by a SPEC that names no implementation (message tails, one line).

``--impl my_adapter`` (a module, ``:Class`` missing) suggests the ``my_adapter:NAME`` in it that
provide an operation of the contract; a near-miss of a registered name suggests that name
(``triton-fast`` -> ``triton-cpu-fast``); the registered names are listed without the mutants,
which are counted (``mutant:NAME (53 deliberately buggy implementations)``).
"""

from __future__ import annotations

import difflib
import types
from typing import Any, Iterable

from mla_fuse_conformance.declarations.operations import OPERATIONS

__all__ = ["close_to", "implementations_in", "in_module", "summary"]


def close_to(name: str, names: Iterable[str]) -> str:
    """``"; did you mean triton-cpu-fast?"`` for a near-miss of one of ``names``, else ``""``."""
    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def implementations_in(module: types.ModuleType) -> list[str]:
    """The names of the classes and objects in ``module`` that have at least one operation of the
    contract (modules it imported excluded)."""
    return sorted(name for name, value in vars(module).items()
                  if not name.startswith("_") and not isinstance(value, types.ModuleType) and _has_operation(value))


def _has_operation(value: Any) -> bool:
    for operation in OPERATIONS:
        try:
            if callable(getattr(value, operation, None)):
                return True
        except Exception:  # noqa: BLE001 - an attribute that raises is not an operation
            continue
    return False


def in_module(module: types.ModuleType, attr: str | None = None) -> str:
    """``"; did you mean my_adapter:MyKernels?"``: the implementations in ``module`` (the one
    closest to ``attr`` first when there is one), or that it holds none."""
    found = implementations_in(module)
    if not found:
        return f"; it holds no class or object with an operation of the contract ({', '.join(OPERATIONS)})"
    close = difflib.get_close_matches(attr, found, n=1, cutoff=0.6) if attr else []
    ordered = close + [name for name in found if name not in close]
    return f"; did you mean {' or '.join(f'{module.__name__}:{name}' for name in ordered)}?"


def summary(names: Iterable[str], mutant_prefix: str) -> str:
    """The registered names without the mutants, which are counted:
    ``reference, triton, ..., mutant:NAME (53 deliberately buggy implementations)``."""
    names = sorted(names)
    mutants = [name for name in names if name.startswith(mutant_prefix)]
    plain = [name for name in names if not name.startswith(mutant_prefix)]
    counted = [f"{mutant_prefix}NAME ({len(mutants)} deliberately buggy implementations)"] if mutants else []
    return ", ".join(plain + counted)
