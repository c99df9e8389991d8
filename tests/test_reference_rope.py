"""Known answers for the reference's RoPE and tables (CONTRACT §1)."""

import math

import pytest
import torch

from mla_fuse_reference import ops, rope, rounding

# A hand-made table: row 1 has (c, s) = (0, 1) for pair 0 and (0.5, 0.75) for pair 1.
# The formula is linear in (c, s), so a non-unit pair is as good a known answer.
HAND_TABLE = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.5, 1.0, 0.75]], dtype=torch.float32)
X = torch.tensor([[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]], dtype=torch.float32)  # [T=1, heads=1, D=6], R=4


@pytest.mark.parametrize("is_neox, expected", [
    # NeoX pairs (x0, x2), (x1, x3): (1, 3) -> (1*0 - 3*1, 3*0 + 1*1); (2, 4) -> (2*.5 - 4*.75, 4*.5 + 2*.75)
    (True, [-3.0, -2.0, 1.0, 3.5, 5.0, 6.0]),
    # GPT-J pairs (x0, x1), (x2, x3): (1, 2) -> (-2, 1); (3, 4) -> (3*.5 - 4*.75, 4*.5 + 3*.75)
    (False, [-2.0, 1.0, -1.5, 4.25, 5.0, 6.0]),
])
def test_hand_computed_rotation(is_neox, expected):
    out = rope.rope(torch.tensor([1]), X, HAND_TABLE, is_neox)
    assert out.flatten().tolist() == expected


def test_position_zero_is_identity():
    table = rope.plain_cos_sin_cache(8, 16)
    x = torch.randn(3, 2, 8)
    torch.testing.assert_close(rope.rope(torch.zeros(3, dtype=torch.long), x, table, True), x, rtol=0, atol=0)


def test_gptj_rotation_is_complex_multiplication():
    # Independent formulation: GPT-J pairs are complex numbers, rotation is x * e^{i p theta}.
    rotary_dim, positions = 16, torch.tensor([0, 1, 7, 1000])
    inv_freq = rope.plain_inv_freq(rotary_dim, 10000.0)
    table = rope.cos_sin_table(inv_freq, 1001)
    x = torch.randn(4, 3, rotary_dim, dtype=torch.float64)
    angles = positions[:, None].double() * inv_freq[None, :]
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(4, 3, -1, 2)) * torch.polar(
        torch.ones_like(angles), angles)[:, None, :]).reshape(x.shape)
    torch.testing.assert_close(rope.rope_exact(positions, x, table, False), expected, rtol=1e-14, atol=1e-14)


def test_plain_table_values():
    table = rope.plain_cos_sin_cache(8, 4, base=10000.0, dtype=torch.float64)
    p, i = 3, 2
    angle = p * 10000.0 ** (-2 * i / 8)
    assert table[p, i].item() == pytest.approx(math.cos(angle), abs=1e-15)
    assert table[p, 4 + i].item() == pytest.approx(math.sin(angle), abs=1e-15)


def test_yarn_worked_example():
    # R=64, base 1e4, original max 4096, factor 40, beta 32/1 -> ramp bounds 10 and 23.
    assert rope.yarn_correction_range(64, 1e4, 4096, 32, 1) == (10, 23)
    inv_freq = rope.yarn_inv_freq(64, 1e4, 40, 4096)
    plain = rope.plain_inv_freq(64, 1e4)
    torch.testing.assert_close(inv_freq[:11], plain[:11], rtol=0, atol=0)  # ramp 0: extrapolated
    torch.testing.assert_close(inv_freq[23:], plain[23:] / 40, rtol=1e-15, atol=0)  # ramp 1: interpolated
    ramp = (16 - 10) / (23 - 10)  # pair 16 is blended
    assert inv_freq[16].item() == pytest.approx(plain[16].item() * (1 - ramp) + plain[16].item() / 40 * ramp)


def test_yarn_table_rows_and_magnitude():
    # DeepSeek-V3: mscale = mscale_all_dim = 1 -> magnitude 1; rows M * f.
    v3 = rope.deepseek_yarn_cos_sin_cache(64, 4096, 1e4, 40, mscale=1, mscale_all_dim=1)
    assert v3.shape == (163840, 64) and v3.dtype == torch.float32
    assert v3[0, :32].eq(1).all() and v3[0, 32:].eq(0).all()
    # mscale_all_dim = 0 (default): magnitude 0.1 * ln(40) + 1, times attn_factor.
    scaled = rope.deepseek_yarn_cos_sin_cache(16, 64, 1e4, 40, attn_factor=0.5, dtype=torch.float64)
    assert scaled[0, 0].item() == pytest.approx((0.1 * math.log(40) + 1) * 0.5, rel=1e-15)
    assert rope.yarn_mscale(1.0, 5.0) == 1.0


def test_yarn_extrapolation_factor_zero_interpolates_everything():
    inv_freq = rope.yarn_inv_freq(32, 1e4, 8, 256, extrapolation_factor=0)
    torch.testing.assert_close(inv_freq, rope.plain_inv_freq(32, 1e4) / 8, rtol=1e-15, atol=0)


def test_yarn_equal_bounds_widen_ramp():
    # beta_fast == beta_slow gives low == high (absent clamping); the ramp must stay finite.
    inv_freq = rope.yarn_inv_freq(32, 1e4, 4, 4096, beta_fast=4, beta_slow=4)
    assert torch.isfinite(inv_freq).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_rotary_embedding_flat_and_head_layouts_agree(dtype):
    table = rope.plain_cos_sin_cache(8, 32, dtype=dtype)
    positions = torch.tensor([5, 31, 0])
    q = torch.randn(3, 4, 10).to(dtype)
    k = torch.randn(3, 2, 10).to(dtype)
    q3, k3 = ops.rotary_embedding(positions, q, k, 10, table, False)
    q2, k2 = ops.rotary_embedding(positions, q.reshape(3, 40), k.reshape(3, 20), 10, table, False)
    assert torch.equal(q3.reshape(3, 40), q2) and torch.equal(k3.reshape(3, 20), k2)
    assert torch.equal(q3[..., 8:], q[..., 8:])  # partial rotary tail passes through


def test_round_once_avoids_double_rounding():
    # Just above a bf16 midpoint but below float32 resolution: float32 would round onto
    # the midpoint and ties-to-even would then go down. Rounding once goes up.
    x = torch.tensor([1 + 2**-8 + 2**-40], dtype=torch.float64)
    assert rounding.round_once(x, torch.bfloat16).item() == 1 + 2**-7
    assert x.to(torch.float32).to(torch.bfloat16).item() == 1.0  # the trap it avoids


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_round_once_matches_torch_on_float32_values(dtype):
    # float32 inputs have no double-rounding hazard, so torch's cast is a valid oracle there.
    bits = torch.randint(-2**31, 2**31 - 1, (200_000,), dtype=torch.int64).to(torch.int32)
    values = bits.view(torch.float32)
    values = values[~torch.isnan(values)]
    ours = rounding.round_once(values.to(torch.float64), dtype)
    assert torch.equal(ours.view(torch.int16), values.to(dtype).view(torch.int16))


def test_yarn_interpolation_divides_once_as_the_engines_do():
    """``interpolated = 1 / (factor * base^(2i/R))`` (vLLM, transformers), not ``(1 / base^(2i/R)) / factor``:
    in fp32 the two differ, and every row of the table with them (docs/INPUTS.md "Tables")."""
    powers = rope.base_powers(64, 1e4, torch.float32)
    interpolated = rope.yarn_inv_freq(64, 1e4, 40, 4096, extrapolation_factor=0, dtype=torch.float32)
    assert torch.equal(interpolated, 1.0 / (40 * powers))
    assert not torch.equal(interpolated, rope.plain_inv_freq(64, 1e4, torch.float32) / 40)


def test_tables_are_computed_in_float64_unless_asked():
    exact = rope.plain_cos_sin_cache(8, 4096, dtype=torch.float64)
    engine = rope.plain_cos_sin_cache(8, 4096, dtype=torch.float64, compute_dtype=torch.float32)
    p, i = 4000, 1
    angle = p * 10000.0 ** (-2 * i / 8)
    assert exact[p, i].item() == pytest.approx(math.cos(angle), abs=1e-13)
    assert engine[p, i].item() != exact[p, i].item()  # fp32 angles drift at large positions
