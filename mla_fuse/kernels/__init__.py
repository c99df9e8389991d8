"""Triton kernels of mla_fuse, one per file, plus shared ``@jit`` helpers.

Backend: every kernel and helper here is decorated with ``jit`` below, which builds a GPU
kernel (``triton.JITFunction``) or an interpreted one (Triton's interpreter, running on CPU
tensors) for this package only: nothing is written to ``os.environ`` or to Triton's global
settings, so other Triton code in the process keeps its own backend. The choice is made once,
when ``mla_fuse.kernels`` is first imported (``mla_fuse.ops`` imports it):

1. ``MLA_FUSE_TRITON_BACKEND=interpreter`` or ``=gpu``, if set;
2. else ``TRITON_INTERPRET`` if set (``1``: interpreter, ``0``: GPU; the ahead-of-time
   compile test builds GPU kernels on a machine without a GPU this way);
3. else the GPU when ``torch.cuda.is_available()``, the interpreter otherwise.

``BACKEND`` and ``INTERPRETED`` say what was chosen.

Interpreter speed: a kernel launch patches ``triton.language`` for the interpreter once,
for the whole launch; Triton's ``InterpretedFunction`` then patches it again on every call
of a ``@jit`` helper from inside the kernel (a scan of every member of ``tl``, ``tl.core``
and ``tl.math``, about a quarter of a fused MLA launch, docs/THROUGHPUT.md). Helpers here
are ``InterpretedHelper``s, which skip that repeated patch; nothing else changes (the GPU
build does not use them).

The kernels never rely on Triton's float down-casts (the interpreter's are wrong,
triton-lang/triton#8322): every rounding to bf16/fp16/fp8 is integer arithmetic on the fp32
bit pattern (``conversions.py``), exact on every backend.
"""

from __future__ import annotations

import inspect
import os
from typing import Callable, Iterable

import torch
from triton.runtime.interpreter import InterpretedFunction, InterpreterError
from triton.runtime.jit import JITFunction

BACKEND_ENV_VAR = "MLA_FUSE_TRITON_BACKEND"
INTERPRET_ENV_VAR = "TRITON_INTERPRET"
BACKENDS = ("interpreter", "gpu")


def choose_backend() -> str:
    """``interpreter`` or ``gpu``, by the rules of the module docstring."""
    chosen = os.environ.get(BACKEND_ENV_VAR, "").strip().lower()
    if chosen:
        if chosen not in BACKENDS:
            raise ValueError(f"${BACKEND_ENV_VAR} must be one of {BACKENDS}, got {chosen!r}")
        return chosen
    interpret = os.environ.get(INTERPRET_ENV_VAR)
    if interpret is not None:
        return "interpreter" if interpret.strip().lower() in ("1", "true", "on", "yes") else "gpu"
    return "gpu" if torch.cuda.is_available() else "interpreter"


BACKEND: str = choose_backend()
#: Whether the kernels of this process are interpreted.
INTERPRETED: bool = BACKEND == "interpreter"


class InterpretedHelper(InterpretedFunction):
    """An interpreted kernel or ``@jit`` helper whose calls from inside a running kernel reuse
    the launch's patch of ``triton.language`` (Triton 3.9's ``InterpretedFunction.__call__``
    patches it again on every call; the patch it makes is the one already in place, since
    ``tl`` and ``tl.core`` are the same module objects for every kernel file). Launches
    (``kernel[grid](...)``) are Triton's own ``run``, unchanged.
    """

    def __call__(self, *args, **kwargs):
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as error:  # as Triton's own __call__ reports it
            raise InterpreterError(repr(error)) from error


#: ``jit(do_not_specialize=EVERY_ARGUMENT, ...)``: every argument of the function but its constexprs
#: (which Triton specialises by definition, and refuses to see listed).
EVERY_ARGUMENT = "every argument"


def jit(fn: Callable | None = None, *, do_not_specialize: Iterable[str] | str = (),
        do_not_specialize_on_alignment: Iterable[str] | str = ()):
    """``@triton.jit`` for the backend chosen above (kernels and the helpers they call).

    ``@jit`` or ``@jit(do_not_specialize=[...], do_not_specialize_on_alignment=[...])``: the two
    options are ``triton.jit``'s (the same meaning in Triton 3.6 and 3.9) and reach both backends:
    ``JITFunction`` leaves those arguments out of its compile key (an integer's ``== 1`` and
    divisibility by 16; a pointer's 16-byte alignment); the interpreter, which compiles nothing,
    keeps them like ``triton.jit`` does for it.
    """
    def names(chosen, function: Callable) -> list[str]:
        if chosen != EVERY_ARGUMENT:
            return list(chosen)
        return [name for name, parameter in inspect.signature(function).parameters.items()
                if "constexpr" not in str(parameter.annotation)]

    def decorate(function: Callable) -> JITFunction | InterpretedFunction:
        options = dict(do_not_specialize=names(do_not_specialize, function),
                       do_not_specialize_on_alignment=names(do_not_specialize_on_alignment, function))
        return InterpretedHelper(function, **options) if INTERPRETED else JITFunction(function, **options)

    return decorate if fn is None else decorate(fn)


__all__ = ["BACKEND", "BACKENDS", "BACKEND_ENV_VAR", "EVERY_ARGUMENT", "INTERPRETED", "INTERPRET_ENV_VAR",
           "InterpretedHelper", "choose_backend", "jit"]
