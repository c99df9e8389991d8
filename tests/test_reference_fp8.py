"""The reference fp8 encoder against ml_dtypes, an independent implementation (CONTRACT §3)."""

import ml_dtypes
import numpy as np
import pytest
import torch

from mla_fuse_reference import fp8, rounding

ML_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def ml_dtypes_codes(values: torch.Tensor, fmt: str) -> torch.Tensor:
    """ml_dtypes' RNE conversion after an explicit clamp (satfinite), NaN mapped to our 0x7F|sign."""
    limit = fp8.FORMATS[fmt].max_finite
    array = values.to(torch.float32).numpy()
    codes = np.clip(array, -limit, limit).astype(ML_DTYPES[fmt]).view(np.uint8).astype(np.int64)
    nan = np.isnan(array)
    codes[nan] = (np.signbit(array[nan]).astype(np.int64) << 7) | fp8.NAN_CODE
    return torch.from_numpy(codes).to(torch.uint8)


def every_float16() -> torch.Tensor:
    return torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).to(torch.float32)


def finite_fp8_values(fmt: str) -> torch.Tensor:
    decoded = fp8.decode(torch.arange(256, dtype=torch.int32).to(torch.uint8), fmt)
    return torch.unique(decoded[torch.isfinite(decoded)])  # sorted, -0 merged into 0


def neighbours(x: torch.Tensor) -> torch.Tensor:
    """``x`` and its float32 neighbours on both sides."""
    return torch.cat([x, torch.nextafter(x, x + 1), torch.nextafter(x, x - 1)])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_float16_value(fmt):
    values = every_float16()
    assert torch.equal(fp8.quantize(values, torch.tensor(1.0), fmt), ml_dtypes_codes(values, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_rounding_midpoint_and_its_neighbours(fmt):
    grid = finite_fp8_values(fmt).to(torch.float32)
    midpoints = (grid[1:] + grid[:-1]) / 2  # exact in float32
    values = neighbours(midpoints)
    assert torch.equal(fp8.quantize(values, torch.tensor(1.0), fmt), ml_dtypes_codes(values, fmt))
    # ties really go to even: every midpoint lands on a code with an even mantissa
    codes = fp8.quantize(midpoints[midpoints.abs() < fp8.FORMATS[fmt].max_finite], torch.tensor(1.0), fmt)
    assert (codes.to(torch.int64) & 1).eq(0).all()


@pytest.mark.parametrize("fmt, largest, nan_like", [("e4m3", 448.0, 0x7F), ("e5m2", 57344.0, 0x7F)])
def test_saturation_and_nan(fmt, largest, nan_like):
    big = torch.tensor([largest, largest * 1.03, largest * 1.0625, largest * 2, 1e30, float("inf")])
    codes = fp8.quantize(torch.cat([big, -big]), torch.tensor(1.0), fmt)
    max_code = fp8.encode(torch.tensor([largest], dtype=torch.float64), fmt).item()
    assert codes[:6].eq(max_code).all() and codes[6:].eq(max_code | 0x80).all()
    assert fp8.decode(torch.tensor([max_code], dtype=torch.uint8), fmt).item() == largest
    nan_codes = fp8.quantize(torch.tensor([float("nan"), -float("nan")]), torch.tensor(1.0), fmt)
    assert nan_codes.tolist() == [nan_like, nan_like | 0x80]
    assert torch.isnan(fp8.decode(nan_codes, fmt)).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_round_trips_every_code(fmt):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = fp8.decode(codes, fmt)
    finite = torch.isfinite(values)
    assert torch.equal(fp8.encode(values[finite], fmt), codes[finite])
    reference_values = torch.from_numpy(codes.numpy().view(ML_DTYPES[fmt]).astype(np.float64))
    assert torch.equal(values.isnan(), reference_values.isnan())
    assert torch.equal(values[~values.isnan()], reference_values[~reference_values.isnan()])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_scale_divides_in_float32(fmt):
    scale = torch.tensor([0.37], dtype=torch.float32)
    x = torch.randn(5000) * 50
    expected = ml_dtypes_codes(x / scale, fmt)  # divide, never multiply by 1/scale
    assert torch.equal(fp8.quantize(x, scale, fmt), expected)
    dequantized = fp8.dequantize(expected, scale, fmt)
    assert torch.equal(dequantized, fp8.decode(expected, fmt) * scale.double())


def test_quantize_from_bfloat16_input():
    x = torch.randn(1000).to(torch.bfloat16)
    assert torch.equal(fp8.quantize(x, torch.tensor(2.0), "e4m3"), ml_dtypes_codes(x.float() / 2, "e4m3"))


def test_powers_of_two_are_exact_without_pow(monkeypatch):
    """The reference builds powers of two from their bits: ``torch.ldexp`` is ``x * pow(2, e)``, and
    ``pow`` on a CUDA device is not exact (on an H200 the reference put fp8 codes one below the correct
    rounding, and verify went red on a correct kernel). With ``ldexp`` and ``pow`` unavailable, the
    encoder, the decoder and the grid rounding still agree with ml_dtypes."""
    def unavailable(*args, **kwargs):
        raise AssertionError("the reference must not depend on pow's accuracy")

    for name in ("ldexp", "pow", "exp2"):
        monkeypatch.setattr(torch, name, unavailable)
    monkeypatch.setattr(torch.Tensor, "__pow__", unavailable)
    values = every_float16()
    for fmt in ("e4m3", "e5m2"):
        codes = fp8.encode(values.double(), fmt)
        assert torch.equal(codes, ml_dtypes_codes(values, fmt)), fmt
        decoded = fp8.decode(codes, fmt)
        finite = torch.isfinite(decoded)
        assert torch.equal(fp8.encode(decoded[finite], fmt), codes[finite]), fmt
    assert torch.equal(rounding.power_of_two(torch.arange(-1022, 1024)),
                       torch.tensor([2.0 ** e for e in range(-1022, 1024)], dtype=torch.float64))
