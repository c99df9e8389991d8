"""Capability declarations (property_tests/contract/capabilities.py) and the feature axes behind them (features.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mla_fuse_conformance.cases import tensors as build
from mla_fuse_conformance.cases import strategies
from mla_fuse_conformance.contract.capabilities import CONTRACT, Capabilities, from_declaration
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase, SlotSpec, TableSpec
from mla_fuse_conformance.cases.features import AXES, AXIS, features
from mla_fuse_conformance.declarations.operations import OPERATIONS

SETTINGS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
ANY_CASE = st.one_of(strategies.rope_cases(), strategies.mla_cases(), strategies.flash_cases())
RESTRICTED = Capabilities(dtypes=("bfloat16",), table_dtypes="input", position_dtypes=("int64",),
                          slot_dtypes=("int64",), query_ranks=(2,), key_optional=False, gqa=False,
                          partial_rotary=False, input_layouts=("contiguous", "packed"), unpacked_heads=False,
                          kv_cache_dtypes=("auto", "fp8_e4m3"), fp8_storage=("uint8",), per_head_scales=False,
                          cache_layouts=("contiguous",), cache_orders=("HND",), empty_batch=False, nan_inputs=False,
                          strided_index_tensors=False, distinct_value_head_size=False, styles=("gptj",),
                          scales=("1",), distinct_kv_scales=False, padding=("none",), short_slot_mapping=False,
                          head_sizes=(8, 16), rotary_dims=(4, 8), latent_dims=(16,))


@SETTINGS
@given(case=ANY_CASE, data=st.data())
def test_moving_a_case_along_an_axis_gives_a_valid_case_with_that_value(case, data):
    axis = data.draw(st.sampled_from([axis for axis in AXES if axis.of(case) is not None]))
    value = data.draw(st.sampled_from(axis.values))
    moved = axis.set(case, value)
    if moved is None:
        return  # not reachable from this case: projections reject, the map does not vary it
    assert axis.of(moved) == value
    build.build(moved, "cpu")  # a case the builder accepts


@SETTINGS
@given(case=ANY_CASE)
def test_projection_lands_inside_the_declared_limits(case):
    projected = RESTRICTED.project(case)
    if projected is not None:
        assert RESTRICTED.allows(projected), RESTRICTED.violations(projected)
        build.build(projected, "cpu")


def test_projection_keeps_the_features_it_need_not_move():
    case = RopeCase(seed=1, tokens=3, heads=2, kv_heads=1, head_size=8, dtype="float16", is_neox=True,
                    table=TableSpec("plain", 8, 16), rank=3)
    projected = Capabilities(dtypes=("bfloat16",)).project(case)
    assert projected.dtype == "bfloat16"
    assert {k: v for k, v in features(projected).items() if k != "dtype"} == \
        {k: v for k, v in features(case).items() if k != "dtype"}


def test_sizes_move_to_the_nearest_declared_size():
    case = RopeCase(seed=1, tokens=3, heads=2, kv_heads=1, head_size=13, dtype="float16", is_neox=True,
                    table=TableSpec("plain", 10, 16))
    projected = Capabilities(head_sizes=(8, 64), rotary_dims=(4, 8)).project(case)
    assert (projected.head_size, projected.table.rotary_dim) == (8, 8)  # R <= D, then the nearest
    assert Capabilities(head_sizes=(8, 64)).violations(case) == {"head size": "13"}
    assert Capabilities(head_sizes=(2,), rotary_dims=(4,)).project(case) is None  # R=4 cannot fit D=2
    assert "head size: only 8, 64" in Capabilities(head_sizes=(64, 8)).describe()


def test_the_table_policy_follows_the_input_dtype():
    caps = Capabilities(table_dtypes="input")
    float32 = RopeCase(seed=1, tokens=1, heads=1, kv_heads=0, head_size=4, dtype="float32", is_neox=True,
                       table=TableSpec("plain", 4, 4))
    bf16 = dataclasses.replace(float32, dtype="bfloat16")
    assert caps.allows(float32)  # a float32 table is the input dtype here
    assert not caps.allows(bf16) and caps.project(bf16).table.dtype == "input"
    assert caps.restrictions()["table dtype"] == ("float32",)


def test_unrotated_operations_ignore_rope_axes():
    case = MlaCase(seed=1, tokens=2, heads=1, latent=3, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="auto",
                   num_blocks=2, block_size=2, slots=SlotSpec(2), table=TableSpec("plain", 4, 1))
    caps = Capabilities(styles=("neox",))
    assert not caps.allows(case, rotates=True)  # is_neox=False
    assert caps.allows(case, rotates=False)
    assert "style" not in caps.restrictions(rotates=False)


def test_pinning_an_axis_outside_the_limits():
    caps = Capabilities(position_dtypes=("int64",))
    pinned = caps.only("positions dtype", "int32")
    assert pinned.allowed("positions dtype", None) == ("int32",)
    assert pinned.allowed("dtype", None) == caps.allowed("dtype", None)


def test_the_head_stride_is_d_where_each_tokens_heads_are_packed():
    """``head stride``: ``D`` for views that pad only tokens or heads (a column slice of a projection viewed
    ``[T, H, D]``, as engines pass it) or a storage offset; ``other`` where more than one head is another stride
    apart (the last dim padded, the outer dims in another memory order); one head has no head stride. Moving to
    ``D`` unpads the last dim and keeps the rest; the strides are the built tensors'."""
    axis = AXIS["head stride"]
    case = RopeCase(seed=1, tokens=3, heads=2, kv_heads=2, head_size=8, dtype="float16", is_neox=True,
                    table=TableSpec("plain", 8, 16), rank=3)
    cases = {"plain": case,
             "column slice": dataclasses.replace(case, key_place=Placement(pad=(0, 4), offset=(0, 2), lead=3)),
             "last dim padded": dataclasses.replace(case, key_place=Placement(pad=(0, 0, 2), offset=(0, 0, 1))),
             "tokens and heads swapped": dataclasses.replace(case, query_place=Placement(order=(1, 0, 2))),
             "one head, last dim padded": dataclasses.replace(case, heads=1, kv_heads=1,
                                                              key_place=Placement(pad=(0, 0, 2)))}
    expected = {"plain": "D", "column slice": "D", "last dim padded": "other", "tokens and heads swapped": "other",
                "one head, last dim padded": "D"}
    for name, each in cases.items():
        args = build.build(each, "cpu").args
        apart = any(t.shape[1] > 1 and t.stride(1) != t.shape[2] for t in (args["query"], args["key"]))
        assert axis.of(each) == expected[name] == ("other" if apart else "D"), name
    moved = axis.set(cases["last dim padded"], "D")
    assert axis.of(moved) == "D" and moved.key_place == Placement(pad=(0, 0), offset=(0, 0))
    assert axis.set(case, "other") is None  # which input, how far apart: the strategies' business
    assert axis.of(dataclasses.replace(case, rank=2)) is None  # rows of H * D
    assert axis.of(MlaCase(seed=1, tokens=2, heads=2, latent=8, rotary_dim=4, dtype="bfloat16",
                           kv_cache_dtype="auto", num_blocks=2, block_size=4, slots=SlotSpec(2),
                           table=TableSpec("plain", 4, 8))) is None


def test_the_defaults_are_the_whole_contract():
    assert Capabilities() == CONTRACT
    assert not CONTRACT.restrictions() and CONTRACT.describe() == []
    for axis in AXES:
        assert CONTRACT.allowed(axis.name, None) == axis.values or axis.name == "table dtype"


@pytest.mark.parametrize("declared, expected", [
    (None, {op: CONTRACT for op in OPERATIONS}),
    (RESTRICTED, {op: RESTRICTED for op in OPERATIONS}),
    ({"dtypes": ("float16",)}, {op: Capabilities(dtypes=("float16",)) for op in OPERATIONS}),
    ({"rotary_embedding": {"query_ranks": (2,)}},
     {op: Capabilities(query_ranks=(2,)) if op == "rotary_embedding" else CONTRACT for op in OPERATIONS}),
])
def test_declarations_in_every_accepted_form(declared, expected):
    assert from_declaration(declared, "x") == expected


@pytest.mark.parametrize("declared, error, message", [
    ({"dtype": ("float16",)}, ValueError, "unknown fields"),
    ({"rotary_embedding": {"nope": 1}}, ValueError, "unknown fields"),
    ({"dtypes": ("float64",)}, ValueError, "not values of the contract"),
    ({"table_dtypes": "fp32"}, ValueError, "table_dtypes"),
    ({"dtypes": "float16"}, TypeError, "tuple of values"),
    ({"head_sizes": 64}, TypeError, "positive ints"),
    ({"padding": ("sometimes",)}, ValueError, "not values of the contract"),
    (["float16"], TypeError, "capabilities must be"),
])
def test_bad_declarations_name_what_is_wrong(declared, error, message):
    with pytest.raises(error, match=message):
        from_declaration(declared, "x")


def test_every_axis_value_is_reachable_by_the_strategies():
    """Each value of each axis is generated (or reached by moving a generated case), so a
    declaration can always be checked against something."""
    seen: dict[str, set] = {axis.name: set() for axis in AXES}

    @settings(max_examples=200, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=ANY_CASE)
    def collect(case):
        for name, value in features(case).items():
            seen[name].add(value)
            seen[name].update(other for other in AXIS[name].values if AXIS[name].set(case, other) is not None)

    collect()
    missing = {name: set(AXIS[name].values) - values for name, values in seen.items() if set(AXIS[name].values) - values}
    assert not missing


def test_moving_a_one_pool_case_inside_the_limits_keeps_its_value_head_size_d():
    """K and V in one pool are each D wide (``tensors._flash_caches``). Moving such a case to full rotary set D to
    the rotary width and left Dv: SGLang's limit check (``value head size Dv != D``) then ran a case the builder
    cannot lay out (``view value_cache does not fit in buffer kv_pool``), reported as the kernel's wrong result.
    Now Dv follows D, and a case the builders cannot lay out is never drawn (``fields.valid``)."""
    from mla_fuse_conformance.cases import fields

    one_pool = FlashCase(seed=6, tokens=4, heads=2, kv_heads=2, head_size=32, value_head_size=32, dtype="bfloat16",
                         kv_cache_dtype="auto", num_blocks=2, block_size=4, slots=SlotSpec(length=4),
                         table=TableSpec("plain", 16, 16), kv_form="flashinfer")
    caps = Capabilities(partial_rotary=False)
    moved = caps.project(one_pool)
    assert (moved.head_size, moved.value_head_size, moved.kv_form) == (16, 16, "flashinfer")
    pinned = caps.only("value head size", "Dv != D").project(one_pool)
    assert (pinned.head_size, pinned.value_head_size, pinned.kv_form) == (16, 17, "split")
    assert not fields.valid(dataclasses.replace(one_pool, value_head_size=16))
