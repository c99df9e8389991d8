"""Does each operation an implementation provides take the contract's positional arguments?

Checked once, when the implementation is loaded, with ``inspect.signature(method).bind(*arguments)``
(``declarations.operations.OPERATION_ARGUMENTS``), so a method that lacks ``scale`` stops the run
at once with one line instead of raising ``TypeError`` in every example. Where no signature can be
read (``torch.ops`` builtins, C extensions), the method is accepted and checked when called.
"""

from __future__ import annotations

import inspect
from typing import Callable

from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS

__all__ = ["UNREADABLE", "contract_signature", "signature_problem"]

UNREADABLE = "signature not readable; checked when called"
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def contract_signature(operation: str) -> str:
    """``concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)``"""
    return f"{operation}({', '.join(OPERATION_ARGUMENTS[operation])})"


def signature_problem(method: Callable, operation: str) -> str | None:
    """None when ``method`` takes the contract's positional arguments of ``operation``,
    ``UNREADABLE`` when its signature cannot be read, else its signature and what does not fit:
    ``(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype) has no parameter for the contract's 'scale'``."""
    arguments = OPERATION_ARGUMENTS[operation]
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return UNREADABLE
    try:
        signature.bind(*arguments)
    except TypeError as error:
        return f"{signature} {_mismatch(signature, arguments) or error}"
    return None


def _mismatch(signature: inspect.Signature, arguments: tuple[str, ...]) -> str:
    """The contract's arguments no parameter takes, or the parameters the contract does not pass."""
    parameters = list(signature.parameters.values())
    positional = [parameter for parameter in parameters if parameter.kind in POSITIONAL]
    takes_any = any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters)
    unplaced = () if takes_any else arguments[len(positional):]
    if unplaced:
        return f"has no parameter for the contract's {', '.join(repr(name) for name in unplaced)}"
    keyword_only = [parameter for parameter in parameters if parameter.kind is inspect.Parameter.KEYWORD_ONLY]
    unfilled = [parameter.name for parameter in positional[len(arguments):] + keyword_only
                if parameter.default is parameter.empty]
    if unfilled:
        return f"requires {', '.join(repr(name) for name in unfilled)}, which the contract does not pass"
    return ""
