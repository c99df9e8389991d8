"""Triton's interpreter made to compute what a GPU computes, for every kernel of a run.

Without a GPU the suite runs Triton kernels under Triton's interpreter (``TRITON_INTERPRET=1``): its own,
a third party's and a team's (``running/devices.interpret_triton_without_a_gpu``). The interpreter has
artifacts a GPU does not, and a verdict must not blame a kernel for them. ``corrected_interpreter()``
(a context) corrects these; ``correct_for_the_run()`` enters it for the rest of the process, which
``mla-fuse verify``, ``repro``, ``compare`` and the pytest plugin do when the suite starts, so every
kernel launched in a run is corrected, a team's included (docs/THIRD_PARTY.md, "Triton's interpreter"):

1. **fp8 conversions** (triton-lang/triton#8322): ties rounded up, 500 stored as 256, overflow and NaN
   stored as finite codes or NaN at random. Corrected: fp32/fp16/bf16 -> fp8 E4M3FN/E5M2 is torch's round
   to nearest even after clamping to the finite max (what a GPU's ``satfinite`` conversion stores, CONTRACT
   §3), NaN kept.
2. **bfloat16 conversions**: widening flushes bf16 subnormals to zero; narrowing fp32 (and fp16, through
   fp32) to bf16 truncates (1 + 2^-8 + 2^-10 is stored as 1.0 where a GPU stores 1.0078125). Corrected:
   bf16 -> fp32 exact (the bits shifted); fp32 -> bf16 in its default rounding rounds to nearest even (an
   explicit ``fp_downcast_rounding="rtz"`` still truncates, as asked), on the bits, a NaN kept with its
   sign and payload (torch's CPU conversion gives 0xffff for every NaN on CPUs with AVX512-BF16).
3. **bfloat16 arithmetic**: the interpreter holds bf16 as its uint16 bits and runs arithmetic on those
   bits (``x * y`` multiplies the bit patterns, ``-x`` negates them as integers; Triton's debugging guide:
   the interpreter "does not support operations on bfloat16", triton#10919). Corrected: elementwise binary
   and unary operations on bf16 operands are computed on their fp32 values, the result rounded to nearest
   even (for add, sub and mul the correctly rounded bf16 result, as on a GPU).
4. **Comparison results typed as their operands** (the mixed-width mask): a comparison's result is
   Triton's ``int1``, but the interpreter labels it with the operands' type (``offsets < n`` is held as
   an int32 tensor of booleans). Broadcast to a block (``tl.broadcast``/``splat``, what ``block_mask &
   (flag > 0)`` does to the scalar side) the label turns the booleans into int32 data, the ``&`` is then
   int32, and a load or store masked by it raises ``InterpreterError: mask has unsupported dtype``
   (Triton 3.6 to 3.9). Corrected: comparisons compute as before (bf16 operands on their values) and
   their result is held as ``int1``.

Every other conversion and operation is Triton's own; ``tl.fma``, ``tl.dot`` and reductions of
bfloat16 are not corrected (no adapted kernel uses them). On a GPU nothing is used: the corrections
replace functions of ``triton.runtime.interpreter`` only. ``tests/test_interpreter_corrections.py``
shows each is needed (a kernel computing wrongly or raising without it) and hides no kernel bug (a
planted one still fails with it).
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import torch
import triton.language as tl
from triton._C.libtriton import ir
from triton.runtime import interpreter
from triton.runtime.interpreter import TensorHandle

# fp8 format (torch dtype) -> largest finite magnitude
FINITE_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
TRITON_FP8 = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
COMPARISONS = frozenset({np.less, np.less_equal, np.greater, np.greater_equal, np.equal, np.not_equal})


def _widened(data: np.ndarray, dtype) -> np.ndarray:
    """fp32/fp16/bf16 interpreter data (bf16 is held as uint16) as float32, exactly."""
    if dtype == tl.bfloat16:
        bits = np.frombuffer(data.tobytes(), dtype=np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(data.shape)
    return data.astype(np.float32)


def _bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to nearest even as bfloat16, held as the interpreter holds it (uint16);
    a NaN stays that NaN, quieted (its sign and leading payload bits: ``bits >> 16 | 0x40``). Computed
    on the bits: torch's CPU conversion turns every NaN into 0xffff on a CPU with AVX512-BF16, which made
    a kernel that multiplies an untouched NaN by 1.0 (SGLang's value path) look as if it changed it."""
    wide = np.array(values, dtype=np.float32).reshape(-1)
    bits = wide.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    return np.where(np.isnan(wide), (bits >> 16) | 0x40, rounded).astype(np.uint16).reshape(np.shape(values))


def exact_convert_float(original, data, input_dtype, output_dtype, rounding_mode):
    """Triton's ``interpreter._convert_float`` with corrections 1 and 2 (module docstring); any other
    conversion goes to ``original``."""
    if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
        return _widened(data, input_dtype).view(np.uint32)
    if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode in (None, ir.ROUNDING_MODE.RTNE):
        return _bf16_bits(np.frombuffer(data.tobytes(), dtype=np.float32).reshape(data.shape))
    fp8 = TRITON_FP8.get(output_dtype)
    if (fp8 is not None and input_dtype in (tl.float32, tl.float16, tl.bfloat16)
            and rounding_mode in (None, ir.ROUNDING_MODE.RTNE)):
        values = torch.from_numpy(np.ascontiguousarray(_widened(data, input_dtype)))
        limit = FINITE_MAX[fp8]
        return values.clamp(-limit, limit).to(fp8).view(torch.uint8).numpy().reshape(data.shape)
    return original(data, input_dtype, output_dtype, rounding_mode)


def corrected_binary_op(builder, original, lhs, rhs, op):
    """``InterpreterBuilder.binary_op`` with corrections 3 and 4: bf16 operands computed on their values,
    a comparison's result held as ``int1``."""
    bf16 = lhs.dtype.scalar == tl.bfloat16 and rhs.dtype.scalar == tl.bfloat16
    if op in COMPARISONS:
        operands = (_widened(lhs.data, tl.bfloat16), _widened(rhs.data, tl.bfloat16)) if bf16 else (lhs.data, rhs.data)
        return TensorHandle(np.asarray(op(*operands), dtype=np.bool_), tl.int1)
    if not bf16:
        return original(builder, lhs, rhs, op)
    result = np.asarray(op(_widened(lhs.data, tl.bfloat16), _widened(rhs.data, tl.bfloat16)))
    return TensorHandle(_bf16_bits(result) if result.dtype == np.float32 else result, tl.bfloat16)


def corrected_unary_op(builder, original, arg, op):
    """``InterpreterBuilder.unary_op`` computing on the values of a bfloat16 operand (correction 3)."""
    if arg.dtype.scalar != tl.bfloat16:
        return original(builder, arg, op)
    result = np.asarray(op(_widened(arg.data, tl.bfloat16)))
    return TensorHandle(_bf16_bits(result) if result.dtype == np.float32 else result, tl.bfloat16)


def _current():
    """The interpreter's functions the corrections replace, as they are now."""
    return interpreter._convert_float, interpreter.InterpreterBuilder.binary_op, interpreter.InterpreterBuilder.unary_op


def _install(functions) -> None:
    interpreter._convert_float, interpreter.InterpreterBuilder.binary_op, interpreter.InterpreterBuilder.unary_op = \
        functions


def _triton_own(functions):
    """Triton's own functions behind ``functions`` (the corrected ones carry them), or None if they are Triton's."""
    return getattr(functions[1], "triton_own", None)


def _corrected(own):
    """The corrected functions in place of Triton's ``own`` (each carrying ``own``: what is installed says
    whether the interpreter is corrected, and no state is kept here)."""
    def binary_op(self, lhs, rhs, op):
        return corrected_binary_op(self, own[1], lhs, rhs, op)

    def unary_op(self, arg, op):
        return corrected_unary_op(self, own[2], arg, op)

    functions = (functools.partial(exact_convert_float, own[0]), binary_op, unary_op)
    binary_op.triton_own = own
    return functions


@contextlib.contextmanager
def corrected_interpreter():
    """Within: the interpreter corrected (module docstring), then as it was. Inside a corrected interpreter
    (a run's, an adapter's own context) nothing changes."""
    current = _current()
    if _triton_own(current) is not None:
        yield
        return
    _install(_corrected(current))
    try:
        yield
    finally:
        _install(current)


@contextlib.contextmanager
def uncorrected_interpreter():
    """Within: Triton's own interpreter, whatever corrections are in place around it (a test showing a
    correction is needed; an adapter asked to run uncorrected), then as it was."""
    current = _current()
    own = _triton_own(current)
    if own is not None:
        _install(own)
    try:
        yield
    finally:
        _install(current)


def correct_for_the_run() -> None:
    """Correct the interpreter for the rest of this process (where it is not already)."""
    current = _current()
    if _triton_own(current) is None:
        _install(_corrected(current))
