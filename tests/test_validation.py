"""Every bad-input rule of CONTRACT §4 raises a clear error that names the argument."""

import pytest
import torch

from mla_fuse import validation


def mla_fused_args(T=4, H=2, L=8, R=4, NB=3, B=2, dtype=torch.bfloat16, cache_dtype=None, kv_cache_dtype="auto"):
    projection = torch.randn(T, L + R).to(dtype)
    return dict(
        positions=torch.arange(T), q_pe=torch.randn(T, H, 2 + R).to(dtype)[..., 2:], k_pe=projection[:, L:],
        kv_c=projection[:, :L], cos_sin_cache=torch.randn(16, R), is_neox=False,
        slot_mapping=torch.tensor([0, -1, 5, 2][:T]), kv_cache=torch.zeros(NB, B, L + R, dtype=cache_dtype or dtype),
        kv_cache_dtype=kv_cache_dtype, kv_cache_scale=torch.tensor([1.0]))


def flash_fused_args(T=3, H=4, Hkv=2, D=8, R=4, NB=2, B=4, dtype=torch.float16):
    return dict(
        positions=torch.arange(T), query=torch.randn(T, H, D).to(dtype), key=torch.randn(T, Hkv, D).to(dtype),
        value=torch.randn(T, Hkv, D).to(dtype), key_cache=torch.zeros(NB, B, Hkv, D, dtype=dtype),
        value_cache=torch.zeros(NB, B, Hkv, D, dtype=dtype), slot_mapping=torch.tensor([1, 2, -1][:T]),
        cos_sin_cache=torch.randn(8, R), is_neox=True, kv_cache_dtype="auto", k_scale=torch.tensor([1.0]),
        v_scale=torch.tensor([1.0]))


def test_valid_arguments_pass():
    validation.check_concat_and_cache_mla_rope_fused(**mla_fused_args(), check_values=True)
    validation.check_concat_and_cache_mla_rope_fused(
        **mla_fused_args(cache_dtype=torch.float8_e4m3fn, kv_cache_dtype="fp8"), check_values=True)
    validation.check_rope_and_reshape_and_cache_flash(**flash_fused_args(), check_values=True)
    args = flash_fused_args()
    validation.check_rotary_embedding(args["positions"], args["query"].flatten(1), args["key"], 8,
                                      args["cos_sin_cache"], True, check_values=True)
    validation.check_rotary_embedding(args["positions"], args["query"], None, 8, args["cos_sin_cache"], True)


MLA_BAD = [
    # (case, change, exception, argument named)
    ("q_pe rank", dict(q_pe=torch.randn(4, 4)), ValueError, "q_pe"),
    ("q_pe dtype mixed", dict(q_pe=torch.randn(4, 2, 4)), TypeError, "q_pe"),
    ("odd rotary width", dict(q_pe=torch.randn(4, 2, 3).bfloat16(), k_pe=torch.randn(4, 3).bfloat16(),
                              kv_cache=torch.zeros(3, 2, 11, dtype=torch.bfloat16),
                              cos_sin_cache=torch.randn(16, 3)), ValueError, "cos_sin_cache"),
    ("table width != R", dict(cos_sin_cache=torch.randn(16, 8)), ValueError, "cos_sin_cache"),
    ("table dtype", dict(cos_sin_cache=torch.randn(16, 4).half()), TypeError, "cos_sin_cache"),
    ("cache width != L+R", dict(kv_cache=torch.zeros(3, 2, 13, dtype=torch.bfloat16)), ValueError, "kv_cache"),
    ("cache dtype auto", dict(kv_cache=torch.zeros(3, 2, 12, dtype=torch.float16)), TypeError, "kv_cache"),
    ("unknown kv_cache_dtype", dict(kv_cache_dtype="int8"), ValueError, "kv_cache_dtype"),
    ("fp8 cache wrong storage", dict(kv_cache_dtype="fp8_e5m2",
                                     kv_cache=torch.zeros(3, 2, 12, dtype=torch.float8_e4m3fn)), TypeError, "kv_cache"),
    ("named dtype mismatch", dict(kv_cache_dtype="float16"), TypeError, "kv_cache_dtype"),
    ("scale two elements", dict(kv_cache_scale=torch.tensor([1.0, 2.0])), ValueError, "kv_cache_scale"),
    ("scale fp16", dict(kv_cache_scale=torch.tensor([1.0]).half()), TypeError, "kv_cache_scale"),
    ("scale not a tensor", dict(kv_cache_scale=1.0), TypeError, "kv_cache_scale"),
    ("slot_mapping float", dict(slot_mapping=torch.tensor([0.0, 1.0])), TypeError, "slot_mapping"),
    ("slot_mapping longer than T", dict(slot_mapping=torch.arange(5)), ValueError, "slot_mapping"),
    ("positions 2-D", dict(positions=torch.arange(4).reshape(2, 2)), ValueError, "positions"),
    ("positions too short", dict(positions=torch.arange(3)), ValueError, "positions"),
    ("inner stride", dict(kv_c=torch.randn(4, 16).bfloat16()[:, ::2]), ValueError, "kv_c"),
    ("k_pe tokens", dict(k_pe=torch.randn(3, 4).bfloat16()), ValueError, "k_pe"),
    ("is_neox not bool", dict(is_neox=1), TypeError, "is_neox"),
    ("device mixed", dict(kv_cache_scale=torch.tensor([1.0], device="meta")), ValueError, "kv_cache_scale"),
]


@pytest.mark.parametrize("case, change, error, argument", MLA_BAD, ids=[c[0] for c in MLA_BAD])
def test_bad_mla_arguments_name_the_argument(case, change, error, argument):
    with pytest.raises(error, match=f"concat_and_cache_mla_rope_fused: .*'{argument}'"):
        validation.check_concat_and_cache_mla_rope_fused(**{**mla_fused_args(), **change})


FLASH_BAD = [
    ("query heads not a multiple", dict(query=torch.randn(3, 3, 8).half()), ValueError, "query"),
    ("rotary wider than head", dict(cos_sin_cache=torch.randn(8, 10)), ValueError, "cos_sin_cache"),
    ("value cache blocks", dict(value_cache=torch.zeros(3, 4, 2, 8, dtype=torch.float16)), ValueError, "value_cache"),
    ("key cache heads", dict(key_cache=torch.zeros(2, 4, 3, 8, dtype=torch.float16)), ValueError, "key_cache"),
    ("per-head scale wrong length", dict(k_scale=torch.ones(3)), ValueError, "k_scale"),
    ("value dtype", dict(value=torch.randn(3, 2, 8)), TypeError, "value"),
    ("cache inner stride", dict(key_cache=torch.zeros(2, 4, 2, 16, dtype=torch.float16)[..., ::2]), ValueError,
     "key_cache"),
]


@pytest.mark.parametrize("case, change, error, argument", FLASH_BAD, ids=[c[0] for c in FLASH_BAD])
def test_bad_flash_arguments_name_the_argument(case, change, error, argument):
    with pytest.raises(error, match=f"rope_and_reshape_and_cache_flash: .*'{argument}'"):
        validation.check_rope_and_reshape_and_cache_flash(**{**flash_fused_args(), **change})


def test_per_head_scales_are_accepted():
    validation.check_rope_and_reshape_and_cache_flash(**{**flash_fused_args(), "k_scale": torch.ones(2),
                                                         "v_scale": torch.tensor([0.5, 2.0])})


@pytest.mark.parametrize("change, message", [
    (dict(positions=torch.tensor([0, 1, 16, 2])), "positions"),  # the table has 16 rows
    (dict(positions=torch.tensor([0, -1, 1, 2])), "positions"),
    (dict(slot_mapping=torch.tensor([0, 6, -1, 1])), "slot_mapping.*6"),  # 3 blocks of 2 slots
    (dict(slot_mapping=torch.tensor([1, -1, 1, -1])), "more than once"),
])
def test_value_checks_need_opt_in(change, message, monkeypatch):
    args = {**mla_fused_args(), **change}
    monkeypatch.delenv(validation.CHECK_VALUES_ENV_VAR, raising=False)
    validation.check_concat_and_cache_mla_rope_fused(**args)  # shape checks only: passes
    with pytest.raises(ValueError, match=message):
        validation.check_concat_and_cache_mla_rope_fused(**args, check_values=True)
    monkeypatch.setenv(validation.CHECK_VALUES_ENV_VAR, "1")
    with pytest.raises(ValueError, match=message):
        validation.check_concat_and_cache_mla_rope_fused(**args)


def test_duplicate_padding_slots_are_fine():
    validation.check_concat_and_cache_mla_rope_fused(**{**mla_fused_args(), "slot_mapping": torch.tensor([-1, -1, 0, -5])},
                                                     check_values=True)


def test_rotary_key_heads_and_head_size():
    args = flash_fused_args()
    with pytest.raises(ValueError, match="'key'"):
        validation.check_rotary_embedding(args["positions"], args["query"], torch.randn(3, 7).half(), 8,
                                          args["cos_sin_cache"], True)
    with pytest.raises(TypeError, match="'head_size'"):
        validation.check_rotary_embedding(args["positions"], args["query"], None, 8.0, args["cos_sin_cache"], True)
    with pytest.raises(ValueError, match="'cos_sin_cache'.*larger than the head size"):
        validation.check_rotary_embedding(args["positions"], args["query"].flatten(1), None, 2,
                                          args["cos_sin_cache"], True)
