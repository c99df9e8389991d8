"""Triton's interpreter corrected for every kernel of a run (``running/interpreter_corrections.py``).

Each correction is needed (the interpreter's own result is wrong or raises on a kernel a GPU runs right)
and hides no kernel bug (a planted one still fails with it on); the fp8 and bfloat16 conversions and
bfloat16 arithmetic are shown the same way in tests/test_liger.py, tests/test_flaggems.py and
tests/test_vllm_triton.py. Here: comparison results (the mixed-width mask), bfloat16 comparisons and
negation and the contexts' nesting. That ``mla-fuse verify`` runs a team's kernel corrected:
tests/test_team_triton_kernel.py.
"""

from __future__ import annotations

import pytest
import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction, InterpreterError

from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the corrections are the interpreter's")


def _masked_copy(x_ptr, out_ptr, n, flag, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = (offsets < n) & (flag > 0)  # a block of int1 and a broadcast scalar int1
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask, other=0.0), mask=mask)


def _masked_copy_one_too_far(x_ptr, out_ptr, n, flag, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = (offsets <= n) & (flag > 0)  # planted: one element past n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask, other=0.0), mask=mask)


def _bf16_less_and_negated(x_ptr, y_ptr, less_ptr, negated_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x, y = tl.load(x_ptr + offsets), tl.load(y_ptr + offsets)
    tl.store(less_ptr + offsets, (x < y).to(tl.int8))
    tl.store(negated_ptr + offsets, -x)


def _bf16_negated_twice_minus_one(x_ptr, negated_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    tl.store(negated_ptr + offsets, -x * tl.full([BLOCK], 1.0, tl.bfloat16) - x)  # planted: -x - x


def _bf16_times_one(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, (tl.load(x_ptr + offsets) * 1.0).to(tl.bfloat16))  # SGLang's v * (1 / v_scale)


def _interpreted(function):
    return InterpretedFunction(function)


def _copy(kernel) -> torch.Tensor:
    x, out = torch.arange(1.0, 9.0), torch.zeros(8)
    _interpreted(kernel)[(1,)](x, out, 5, 1, BLOCK=8)
    return out


def test_a_mixed_width_mask_raises_in_the_interpreter_and_runs_corrected():
    with uncorrected_interpreter(), pytest.raises(InterpreterError, match="mask has unsupported dtype"):
        _copy(_masked_copy)
    with corrected_interpreter():
        assert _copy(_masked_copy).tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
        assert _copy(_masked_copy_one_too_far).tolist() == [1, 2, 3, 4, 5, 6, 0, 0], "the planted bug is hidden"


def test_bf16_comparisons_and_negation_are_on_values():
    x = torch.tensor([1.5, -2.0, 3.25, 0.5], dtype=torch.bfloat16)
    y = torch.tensor([-1.0, 1.0, 3.5, 0.25], dtype=torch.bfloat16)
    got = {}
    for corrected in (False, True):
        less, negated = torch.empty(4, dtype=torch.int8), torch.empty_like(x)
        with corrected_interpreter() if corrected else uncorrected_interpreter():
            _interpreted(_bf16_less_and_negated)[(1,)](x, y, less, negated, BLOCK=4)
        got[corrected] = less.tolist(), negated.tolist()
    assert got[True] == ([0, 1, 1, 0], [-1.5, 2.0, -3.25, -0.5])
    assert got[False] != got[True], "the interpreter now compares and negates bfloat16 values: is triton#10919 fixed?"
    planted = torch.empty_like(x)
    with corrected_interpreter():
        _interpreted(_bf16_negated_twice_minus_one)[(1,)](x, planted, BLOCK=4)
    assert planted.tolist() == [-3.0, 4.0, -6.5, -1.0], "a planted bf16 bug (-x - x) is computed as written"


def test_a_bf16_nan_narrowed_from_fp32_keeps_its_bits():
    """The correction narrowed fp32 to bf16 with torch's CPU conversion, which gives 0xffff for every NaN on
    a CPU with AVX512-BF16: a value cache written through ``v * 1.0`` (SGLang's fused write with no scale)
    read as a changed NaN (0x7fc0 -> 0xffff), a failure of the suite, not the kernel. Rounding stays
    to nearest even (1 + 2^-8 + 2^-10 -> 1.0078125), and a NaN is quieted with its sign and payload."""
    x = torch.tensor([0x7FC0, -0x0040, 0x7F81, 0x3F80], dtype=torch.int16).view(torch.bfloat16)  # NaN, -NaN, sNaN, 1
    wide = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -10])
    out = torch.empty(4, dtype=torch.bfloat16)
    with corrected_interpreter():
        _interpreted(_bf16_times_one)[(1,)](x, out, BLOCK=4)
        rounded = torch.empty(1, dtype=torch.bfloat16)
        _interpreted(_bf16_times_one)[(1,)](wide, rounded, BLOCK=1)
    assert [hex(v & 0xFFFF) for v in out.view(torch.int16).tolist()] == ["0x7fc0", "0xffc0", "0x7fc1", "0x3f80"]
    assert rounded.item() == 1.0078125


def test_contexts_nest_and_restore_triton_s_own_functions():
    from triton.runtime import interpreter

    own = interpreter._convert_float, interpreter.InterpreterBuilder.binary_op
    with uncorrected_interpreter():
        with corrected_interpreter():
            patched = interpreter._convert_float, interpreter.InterpreterBuilder.binary_op
            with corrected_interpreter():  # an adapter's context inside a corrected run: the same functions
                assert (interpreter._convert_float, interpreter.InterpreterBuilder.binary_op) == patched
            with uncorrected_interpreter():
                assert (interpreter._convert_float, interpreter.InterpreterBuilder.binary_op) != patched
            assert (interpreter._convert_float, interpreter.InterpreterBuilder.binary_op) == patched
        assert patched != own

