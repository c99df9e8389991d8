"""``triton-cpu-fast`` (the kernels as vectorized torch) writes the interpreted kernels' bits, every one.

The fast CPU path (``mla_fuse_conformance.adapters.triton_cpu_fast``) is only worth running
in place of the kernels while it is the same function. These tests fail on any differing
bit, NaN payloads included:

* every operation on the suite's own cases (the strategies the properties draw from,
  the edge cases first): two builds of one case, the kernels on one and the twin on the
  other, then every buffer compared whole (the arguments' parents and their sentinels);
* the rounding of arbitrary fp32 values to bf16/fp16 (ties, subnormals, overflow, NaN
  payloads), fed through the rotation with a table that holds the values (``a = 1,
  b = 0`` pairs, so ``a' = 1*c - 0*s = c`` exactly before the rounding);
* fp8 quantization of arbitrary values at several scales, through the MLA cache write.

Under the interpreter (CPU) this compares with the interpreted kernels; on a GPU with
the compiled ones.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, strategies as st

from mla_fuse_conformance.cases import tensors as builder
from mla_fuse_conformance.judging import comparisons
from mla_fuse_conformance.running import checks
from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.contract.implementation import load_implementation
from mla_fuse_conformance.running.devices import select_device

DEVICE = select_device()
KERNELS = load_implementation("triton")
FAST = load_implementation("triton-cpu-fast")
CASES = {  # operation -> (the suite's strategy for it, its edge cases)
    "rotary_embedding": (strategies.rope_cases(), strategies.edge_cases("rope")),
    "concat_and_cache_mla": (strategies.mla_cases(fused=False), strategies.edge_cases("mla")),
    "concat_and_cache_mla_rope_fused": (strategies.mla_cases(fused=True), strategies.edge_cases("mla")),
    "reshape_and_cache_flash": (strategies.flash_cases(fused=False), strategies.edge_cases("flash")),
    "rope_and_reshape_and_cache_flash": (strategies.flash_cases(fused=True), strategies.edge_cases("flash")),
}


def test_declarations_are_the_kernels():
    for declaration in ("rounding", "padded_rows", "checks_inputs", "operations"):
        assert getattr(FAST, declaration) == getattr(KERNELS, declaration), declaration


def assert_same_bits(operation: str, case) -> None:
    kernels, fast = builder.build(case, DEVICE), builder.build(case, DEVICE)
    check_values = getattr(case, "check_values", False)
    checks.call(KERNELS, operation, kernels.args, check_values)
    checks.call(FAST, operation, fast.args, check_values)
    comparisons.assert_buffers_equal(
        kernels.buffers, {name: buffer.flat for name, buffer in fast.buffers.items()},
        {name: buffer.flat for name, buffer in kernels.buffers.items()},
        f"{operation}: triton-cpu-fast and the Triton kernels wrote different bits (got: fast path; "
        f"expected: kernels) for case = {case!r}")


@pytest.mark.parametrize("operation", sorted(CASES))
def test_edge_cases_same_bits(operation):
    for case in CASES[operation][1]:
        assert_same_bits(operation, case)


@pytest.mark.parametrize("operation", sorted(CASES))
@given(data=st.data())
def test_suite_cases_same_bits(operation, data):
    case = data.draw(CASES[operation][0], label="case")
    assert_same_bits(operation, case)


# ---------------------------------------------------------------- conversions on arbitrary values


def float32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    return torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.float32)


def hard_float32_values() -> torch.Tensor:
    """Random bit patterns (NaN payloads and subnormals included), every bf16 value with its
    rounding tie and the tie's neighbours, every fp16 value with its tie and neighbours."""
    random_bits = torch.randint(0, 2 ** 32, (1 << 16,), generator=torch.Generator().manual_seed(7), dtype=torch.int64)
    bf16 = torch.arange(1 << 16, dtype=torch.int64) << 16
    fp16 = torch.arange(-2 ** 15, 2 ** 15).to(torch.int16).view(torch.float16).float().view(torch.int32)
    fp16 = fp16.to(torch.int64) & 0xFFFFFFFF
    near_ties = [bf16 | low for low in (0x7FFF, 0x8000, 0x8001)] + [fp16 + low for low in (0, 0xFFF, 0x1000, 0x1001)]
    return float32_from_bits(torch.cat([random_bits, bf16, *near_ties]) & 0xFFFFFFFF)


def rotate_values_through(impl, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``round(values)`` to ``dtype`` as ``impl``'s rotary_embedding computes it: pairs (1, 0)
    against table rows ``(cos, sin) = (value, 0)`` give ``a' = round(1*value - 0*0)``."""
    count = values.numel()
    table = torch.stack([values, torch.zeros_like(values)], dim=1).to(DEVICE)
    query = torch.tensor([1.0, 0.0], dtype=dtype).repeat(count, 1, 1).to(DEVICE)
    positions = torch.arange(count, device=DEVICE)
    impl.op("rotary_embedding")(positions, query, None, 2, table, False)
    return query[:, 0, 0].cpu()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_rounding_same_bits(dtype):
    values = hard_float32_values()
    kernels, fast = rotate_values_through(KERNELS, values, dtype), rotate_values_through(FAST, values, dtype)
    kernel_bits, fast_bits = (x.view(torch.int16).to(torch.int64) & 0xFFFF for x in (kernels, fast))
    differs = (kernel_bits != fast_bits).nonzero()
    if differs.numel():
        i = int(differs[0])
        raise AssertionError(f"round to {dtype}: {differs.numel()} values differ; first: "
                             f"0x{int(values.view(torch.int32)[i]) & 0xFFFFFFFF:08x} -> kernels "
                             f"0x{int(kernel_bits[i]):04x}, fast path 0x{int(fast_bits[i]):04x}")


def fp8_boundaries(kv_cache_dtype: str, scale: float) -> torch.Tensor:
    """Every fp8 value and every rounding tie between neighbours, times ``scale``, with the fp32
    values one ulp either side: where a quotient's last bit decides the code."""
    float8 = torch.float8_e4m3fn if kv_cache_dtype == "fp8_e4m3" else torch.float8_e5m2
    grid = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(float8).to(torch.float64)
    grid = grid[torch.isfinite(grid)].unique()
    points = (torch.cat([grid, (grid[1:] + grid[:-1]) / 2]) * scale).to(torch.float32)
    bits = points.view(torch.int32).to(torch.int64)
    return float32_from_bits(torch.cat([bits - 1, bits, bits + 1]) & 0xFFFFFFFF)


def quantize_values_through(impl, values: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    """fp8 codes of fp32 ``values`` as ``impl``'s concat_and_cache_mla writes them (one entry per 64 values)."""
    latent = values.view(-1, 64).to(DEVICE)
    k_pe = torch.zeros(latent.size(0), 2, device=DEVICE)
    cache = torch.zeros(latent.size(0), 1, 66, dtype=torch.uint8, device=DEVICE)
    slots = torch.arange(latent.size(0), device=DEVICE)
    impl.op("concat_and_cache_mla")(latent, k_pe, cache, slots, kv_cache_dtype,
                                    torch.tensor([scale], device=DEVICE))
    return cache[:, 0, :64].reshape(-1).cpu()


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("scale", [1.0, 0.375, 3.0, 2.0 ** -10], ids=["1", "0.375", "3", "2^-10"])
def test_quantize_same_bits(kv_cache_dtype, scale):
    values = torch.cat([hard_float32_values(), fp8_boundaries(kv_cache_dtype, scale)])
    values = torch.cat([values, torch.zeros(-values.numel() % 64)])  # whole cache entries of 64
    kernels = quantize_values_through(KERNELS, values, kv_cache_dtype, scale)
    fast = quantize_values_through(FAST, values, kv_cache_dtype, scale)
    differs = (kernels != fast).nonzero()
    if differs.numel():
        i = int(differs[0])
        raise AssertionError(f"quantize {kv_cache_dtype} scale {scale}: {differs.numel()} codes differ; first: "
                             f"{float(values[i])!r} -> kernels 0x{int(kernels[i]):02x}, fast path 0x{int(fast[i]):02x}")
