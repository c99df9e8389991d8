"""Every bad-input rule of CONTRACT §4 raises a clear error that names the argument."""

import pytest
import torch

from mla_fuse import layouts, validation


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
    (dict(slot_mapping=torch.tensor([1, -1, 1, -1])), "slot 1 for tokens 0 and 2"),
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


# ---------------------------------------------------------------- the edges of the inputs (docs/INPUTS.md)
# Every call below goes through the public wrapper (ops.*) or the custom op compiled graphs call
# (torch.ops.mla_fuse.*). Written buffers are views into a parent filled with a sentinel, so
# "nothing written" is a bitwise comparison of the parent.

import numpy as np  # noqa: E402

from mla_fuse import ops  # noqa: E402


def in_parent(shape, dtype=torch.float32, pad=3):
    """A view of ``shape`` inside a larger parent full of a sentinel; returns (view, parent)."""
    parent = torch.full((shape[0] + pad, *shape[1:-1], shape[-1] + pad), 0.625).to(dtype)
    return parent[(slice(1, 1 + shape[0]), *(slice(None),) * (len(shape) - 2), slice(1, 1 + shape[-1]))], parent


def assert_rejected(call, error, *names):
    """``call`` raises ``error`` whose message names every one of ``names``."""
    with pytest.raises(error) as raised:
        call()
    for name in names:
        assert f"'{name}'" in str(raised.value), f"the message does not name '{name}': {raised.value}"
    return str(raised.value)


def direct(name):
    return getattr(torch.ops.mla_fuse, name)


ENTRY_POINTS = {"wrapper": lambda name: getattr(ops, name), "direct": direct}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_query_passed_as_key_is_rejected_before_rotating(entry):
    args = flash_fused_args()
    query, parent = in_parent((3, 4, 8))
    before = parent.clone()
    assert_rejected(lambda: ENTRY_POINTS[entry]("rotary_embedding")(args["positions"], query, query, 8,
                                                                   args["cos_sin_cache"], True),
                    ValueError, "query", "key")
    assert torch.equal(parent, before)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_key_cache_passed_as_value_cache_is_rejected(entry):
    args = flash_fused_args(dtype=torch.float32)
    cache, parent = in_parent(tuple(args["key_cache"].shape))
    before = parent.clone()
    call_args = {**args, "key_cache": cache, "value_cache": cache}
    assert_rejected(lambda: ENTRY_POINTS[entry]("rope_and_reshape_and_cache_flash")(*call_args.values()),
                    ValueError, "key_cache", "value_cache")
    assert torch.equal(parent, before)


def test_overlapping_q_pe_and_k_pe_are_rejected():
    args = mla_fused_args(dtype=torch.float32)
    q_pe = torch.randn(4, 2, 4)
    assert_rejected(lambda: ops.concat_and_cache_mla_rope_fused(**{**args, "q_pe": q_pe, "k_pe": q_pe[:, 1, :]}),
                    ValueError, "q_pe", "k_pe")


def test_a_read_argument_inside_a_written_one_is_rejected():
    args = mla_fused_args(dtype=torch.float32)
    cache = args["kv_cache"]
    assert_rejected(lambda: ops.concat_and_cache_mla(cache.view(-1, 12)[:4, :8], args["k_pe"], cache,
                                                     args["slot_mapping"], "auto", args["kv_cache_scale"]),
                    ValueError, "kv_c", "kv_cache")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_expanded_cache_is_rejected(entry):
    """A stride-0 (expanded) cache maps every block to the same memory."""
    args = mla_fused_args(dtype=torch.float32)
    cache = torch.zeros(1, 2, 12).expand(3, 2, 12)
    call = ENTRY_POINTS[entry]("concat_and_cache_mla_rope_fused")
    assert_rejected(lambda: call(*{**args, "kv_cache": cache}.values()), ValueError, "kv_cache")


def test_packed_and_pooled_layouts_that_do_not_overlap_are_accepted():
    """Column slices of one projection, K and V interleaved in one pool, q/k/v packed: no false alarm."""
    validation.check_concat_and_cache_mla_rope_fused(**mla_fused_args(), check_values=True)  # kv_c | k_pe packed
    args = flash_fused_args()
    pool = torch.zeros(2, 4, 2, 2, 8, dtype=torch.float16)  # [NB, B, K|V, Hkv, D]
    qkv = torch.randn(3, 4 * 8 + 2 * 2 * 8).half()
    packed = dict(query=qkv[:, :32].view(3, 4, 8), key=qkv[:, 32:48].view(3, 2, 8), value=qkv[:, 48:].view(3, 2, 8))
    validation.check_rope_and_reshape_and_cache_flash(
        **{**args, **packed, "key_cache": pool[:, :, 0], "value_cache": pool[:, :, 1]}, check_values=True)


def test_empty_table_and_empty_cache_are_rejected_in_process():
    """The subprocess test (test_bad_input_crashes.py) shows the process survives; this one checks the message."""
    args = mla_fused_args()
    assert_rejected(lambda: ops.concat_and_cache_mla_rope_fused(**{**args, "cos_sin_cache": torch.randn(0, 4)}),
                    ValueError, "cos_sin_cache")
    assert_rejected(lambda: ops.concat_and_cache_mla_rope_fused(**{**args, "kv_cache": args["kv_cache"][:0]}),
                    ValueError, "kv_cache")
    assert_rejected(lambda: ops.concat_and_cache_mla_rope_fused(**{**args, "kv_cache": args["kv_cache"][:, :0]}),
                    ValueError, "kv_cache")


@pytest.mark.parametrize("change, names", [
    (dict(kv_c=torch.randn(4, 0).bfloat16(), kv_cache=torch.zeros(3, 2, 4, dtype=torch.bfloat16)), ("kv_c",)),
    (dict(q_pe=torch.randn(4, 0, 4).bfloat16()), ("q_pe",)),
])
def test_zero_widths_and_heads_are_rejected(change, names):
    assert_rejected(lambda: ops.concat_and_cache_mla_rope_fused(**{**mla_fused_args(), **change}), ValueError, *names)


def test_zero_kv_heads_are_rejected_not_divided_by():
    args = flash_fused_args()
    zero_heads = dict(query=args["query"][:, :0], key=args["key"][:, :0], value=args["value"][:, :0],
                      key_cache=args["key_cache"][:, :, :0], value_cache=args["value_cache"][:, :, :0])
    assert_rejected(lambda: ops.rope_and_reshape_and_cache_flash(**{**args, **zero_heads}), ValueError, "key")


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_fp8_scale_must_be_finite_and_positive_when_values_are_checked(scale, entry, monkeypatch):
    args = mla_fused_args(dtype=torch.float32, cache_dtype=torch.uint8, kv_cache_dtype="fp8")
    cache, parent = in_parent(tuple(args["kv_cache"].shape), torch.uint8)
    args.update(kv_cache=cache, kv_cache_scale=torch.tensor([scale]))
    before = parent.clone()
    if entry == "wrapper":
        call = lambda: ops.concat_and_cache_mla_rope_fused(**args, check_values=True)  # noqa: E731
    else:
        monkeypatch.setenv(validation.CHECK_VALUES_ENV_VAR, "1")
        call = lambda: direct("concat_and_cache_mla_rope_fused")(*args.values())  # noqa: E731
    assert_rejected(call, ValueError, "kv_cache_scale")
    assert torch.equal(parent, before)


def test_one_bad_per_head_scale_is_named():
    args = flash_fused_args()
    args.update(kv_cache_dtype="fp8_e5m2", key_cache=args["key_cache"].to(torch.uint8),
                value_cache=args["value_cache"].to(torch.uint8), v_scale=torch.tensor([1.0, 0.0]))
    assert_rejected(lambda: validation.check_rope_and_reshape_and_cache_flash(**args, check_values=True), ValueError,
                    "v_scale")


def test_unused_scale_of_a_non_fp8_cache_is_not_checked():
    validation.check_concat_and_cache_mla_rope_fused(**{**mla_fused_args(), "kv_cache_scale": torch.tensor([0.0])},
                                                     check_values=True)


def test_direct_op_call_with_too_narrow_cache_is_rejected_before_writing():
    args = mla_fused_args(dtype=torch.float32)
    cache, parent = in_parent((3, 2, 11))  # entry width L + R - 1
    before = parent.clone()
    assert_rejected(lambda: direct("concat_and_cache_mla")(args["kv_c"], args["k_pe"], cache, args["slot_mapping"],
                                                           "auto", args["kv_cache_scale"]), ValueError, "kv_cache")
    assert torch.equal(parent, before)


def test_direct_op_call_with_unknown_kv_cache_dtype_names_it():
    args = mla_fused_args(cache_dtype=torch.uint8)
    assert_rejected(lambda: direct("concat_and_cache_mla")(args["kv_c"], args["k_pe"], args["kv_cache"],
                                                           args["slot_mapping"], "fp8_e4m3fn", args["kv_cache_scale"]),
                    ValueError, "kv_cache_dtype")


def test_direct_op_call_checks_values_under_the_environment_switch(monkeypatch):
    args = {**mla_fused_args(), "positions": torch.tensor([0, 1, 16, 2])}
    monkeypatch.setenv(validation.CHECK_VALUES_ENV_VAR, "1")
    assert_rejected(lambda: direct("concat_and_cache_mla_rope_fused")(*args.values()), ValueError, "positions")


def test_check_values_keyword_wins_over_the_environment(monkeypatch):
    args = {**mla_fused_args(), "positions": torch.tensor([0, 1, 16, 2])}
    monkeypatch.delenv(validation.CHECK_VALUES_ENV_VAR, raising=False)
    assert_rejected(lambda: ops.concat_and_cache_mla_rope_fused(**args, check_values=True), ValueError, "positions")
    assert not validation.values_checked(None)  # the keyword does not leak out of the call


def test_query_with_heads_first_is_blamed_not_key():
    args = flash_fused_args()  # query [T=3, H=4, D], key [3, 2, D]
    heads_first = args["query"].transpose(0, 1)
    message = assert_rejected(lambda: ops.rotary_embedding(args["positions"], heads_first, args["key"], 8,
                                                           args["cos_sin_cache"], True), ValueError, "query")
    assert message.startswith("rotary_embedding: argument 'query' has 4 rows")


def test_head_size_may_be_any_integer_type():
    args = flash_fused_args()
    validation.check_rotary_embedding(args["positions"], args["query"], args["key"], np.int64(8),
                                      args["cos_sin_cache"], True)
    query, key = args["query"].float(), args["key"].float()
    table = args["cos_sin_cache"]
    ops.rotary_embedding(args["positions"], query, key, np.int64(8), table, True)


@pytest.mark.parametrize("head_size, error", [(0, ValueError), (-8, ValueError), (8.0, TypeError), (True, TypeError)])
def test_head_size_zero_is_a_value_error_and_a_float_a_type_error(head_size, error):
    args = flash_fused_args()
    assert_rejected(lambda: ops.rotary_embedding(args["positions"], args["query"], args["key"], head_size,
                                                 args["cos_sin_cache"], True), error, "head_size")


def test_duplicate_slot_message_names_the_slot_and_the_tokens():
    args = {**mla_fused_args(), "slot_mapping": torch.tensor([3, -1, 5, 3])}
    message = assert_rejected(lambda: validation.check_concat_and_cache_mla_rope_fused(**args, check_values=True),
                              ValueError, "slot_mapping")
    assert "slot 3" in message and "tokens 0 and 3" in message


def test_a_remembered_layout_is_checked_again_once_its_metadata_changes():
    """The checkers skip layouts they passed before; a tensor restrided in place is a new layout."""
    args = mla_fused_args(dtype=torch.float32)
    validation.check_concat_and_cache_mla_rope_fused(**args)
    validation.check_concat_and_cache_mla_rope_fused(**args)  # remembered
    args["kv_cache"].as_strided_((3, 2, 12), (0, 12, 1))  # the same tensor object, every block one block now
    assert_rejected(lambda: validation.check_concat_and_cache_mla_rope_fused(**args), ValueError, "kv_cache")


def test_value_checks_are_never_skipped_for_a_remembered_layout():
    args = mla_fused_args()
    validation.check_concat_and_cache_mla_rope_fused(**args)
    args["positions"][2] = 16  # same layout, a position past the 16-row table
    assert_rejected(lambda: validation.check_concat_and_cache_mla_rope_fused(**args, check_values=True), ValueError,
                    "positions")


def _shared_shapes_then_overlap(operation):
    """(valid arguments, arguments of the same shapes, strides, dtypes and devices at other addresses in which
    a written buffer overlaps another argument, the names the error must give)."""
    if operation == "rotary_embedding":
        valid = dict(positions=torch.arange(3), query=torch.randn(3, 2, 8), key=torch.randn(3, 2, 8), head_size=8,
                     cos_sin_cache=torch.randn(8, 4), is_neox=True)
        query = torch.randn(3, 2, 8)
        return valid, {**valid, "query": query, "key": query}, ("query", "key")
    if operation in ("concat_and_cache_mla", "concat_and_cache_mla_rope_fused"):
        valid = mla_fused_args(dtype=torch.float32)
        cache = torch.zeros_like(valid["kv_cache"])
        in_cache = cache.view(-1, cache.size(-1))[:4, :8]  # kv_c's shape and strides, inside the cache
        overlapping = {**valid, "kv_cache": cache, "kv_c": in_cache}
        if operation == "concat_and_cache_mla":
            names = ("kv_c", "k_pe", "kv_cache", "slot_mapping", "kv_cache_dtype")
            valid = {name: valid[name] for name in names} | {"scale": valid["kv_cache_scale"]}
            overlapping = {name: overlapping[name] for name in names} | {"scale": valid["scale"]}
        return valid, overlapping, ("kv_cache", "kv_c")
    valid = flash_fused_args()
    cache = torch.zeros_like(valid["key_cache"])
    in_cache = cache.view(-1, *cache.shape[2:])[:3]  # key's shape and strides, inside the cache
    overlapping = {**valid, "key_cache": cache, "key": in_cache}
    if operation == "reshape_and_cache_flash":
        names = ("key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale")
        valid, overlapping = ({name: args[name] for name in names} for args in (valid, overlapping))
    return valid, overlapping, ("key", "key_cache")


@pytest.mark.parametrize("operation", ["rotary_embedding", "concat_and_cache_mla", "concat_and_cache_mla_rope_fused",
                                       "reshape_and_cache_flash", "rope_and_reshape_and_cache_flash"])
def test_a_layout_whose_shapes_passed_elsewhere_is_still_checked_for_overlap(operation):
    """A checker that passed a layout's shapes at other addresses (another layer's cache) runs only the
    overlap check for new addresses; that check still rejects a written buffer overlapping another
    argument. Planted and seen failing: the shapes' path skipping the overlap check; one operation given
    another's overlap check."""
    check = validation.CHECKERS[operation]
    valid, overlapping, names = _shared_shapes_then_overlap(operation)
    layouts.forget_layouts()
    check(**valid)
    message = assert_rejected(lambda: check(**overlapping), ValueError, *names)
    assert "overlap" in message
    layouts.forget_layouts()
    assert_rejected(lambda: check(**overlapping), ValueError, *names)  # the same verdict from the full checks
