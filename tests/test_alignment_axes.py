"""The alignment axes (``cases/alignment_axes.py``): computed from a case's fields, they agree with the
addresses of the tensors the case builds, and a setter reaches a value by moving a storage offset."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings

from mla_fuse_conformance.cases import alignment_axes, tensors
from mla_fuse_conformance.cases.features import AXIS
from mla_fuse_conformance.cases.types import FlashCase, MlaCase, Placement, RopeCase, SlotSpec, TableSpec
from mla_fuse_conformance.running.harness import property_named

AXES_OF_INPUTS = {"q alignment": ("query", "q_pe"), "k alignment": ("key", "k_pe"), "kv_c alignment": ("kv_c",)}


def _largest_alignment(addresses) -> str:
    common = math.gcd(*addresses) if addresses else 0
    return next((str(size) for size in (64, 32, 16) if common % size == 0), "<16")


def _input_addresses(case, view, name: str) -> list[int]:
    """The byte addresses of every row, head and rotated-half start of ``view`` (``view.data_ptr()``)."""
    mla = isinstance(case, MlaCase)
    width = case.rotary_dim if name in ("q_pe", "k_pe") else case.latent if name == "kv_c" else case.head_size
    heads = view.size(1) if view.dim() == 3 else view.size(1) // width
    head_stride = view.stride(1) if view.dim() == 3 else width
    rotary = case.rotary_dim if mla else case.table.rotary_dim
    halves = (0, rotary // 2) if case.is_neox and name != "kv_c" else (0,)
    return [view.data_ptr() + (token * view.stride(0) + head * head_stride + half) * view.element_size()
            for token in range(min(view.size(0), 2)) for head in range(min(heads, 2)) for half in halves]


def _cache_addresses(built) -> list[int]:
    cache = built.args.get("kv_cache", built.args.get("key_cache"))
    steps = [cache.stride(d) * cache.element_size() for d in range(cache.dim() - 1) if cache.size(d) > 1]
    if getattr(built.case, "kv_form", "split") != "split":
        steps.append(built.args["value_cache"].data_ptr() - cache.data_ptr())
    return [cache.data_ptr(), *steps]


def _check_against_addresses(case) -> None:
    built = tensors.build(case, "cpu")
    for axis, names in AXES_OF_INPUTS.items():
        name = next((n for n in names if built.args.get(n) is not None), None)
        if name is not None and case.tokens:
            expected = _largest_alignment(_input_addresses(case, built.args[name], name))
            assert AXIS[axis].of(case) == expected, f"{axis} of {case!r}: {AXIS[axis].of(case)}, built {expected}"
    if not isinstance(case, RopeCase):
        assert AXIS["cache alignment"].of(case) == _largest_alignment(_cache_addresses(built)), repr(case)


@pytest.mark.parametrize("prop_name", ["test_rotary_embedding:test_rotary_embedding_matches_reference",
                                       "test_mla:test_fused_mla_matches_reference",
                                       "test_flash:test_fused_flash_matches_reference"])
def test_alignment_from_fields_is_the_built_tensors_alignment(prop_name):
    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=property_named(prop_name).strategies[0])
    def check(case):
        _check_against_addresses(case)

    check()


def _rope(rotary_dim: int, head_size: int, lead: int = 0, heads: int = 1) -> RopeCase:
    return RopeCase(seed=0, tokens=3, heads=heads, kv_heads=1, head_size=head_size, dtype="bfloat16", is_neox=True,
                    table=TableSpec("plain", rotary_dim, 16), query_place=Placement(lead=lead))


@pytest.mark.parametrize("case, value", [
    (_rope(64, 64), "64"), (_rope(32, 32), "32"), (_rope(16, 16), "16"),  # the half at R/2: 64, 32, 16 bytes
    (_rope(18, 18), "<16"),  # a half of 9 bf16: the second half 18 bytes in
    (_rope(64, 64, lead=8), "16"), (_rope(64, 64, lead=1), "<16"),  # q 8 or 1 element into its buffer
    (_rope(32, 36, heads=2), "<16"),  # the second 36-wide head starts 72 bytes in
])
def test_q_alignment_of_the_vllm_cpu_geometries(case, value):
    """The geometries docs/VLLM_CPU.md measured: ``<16`` exactly where the aligned store faults."""
    assert alignment_axes.q_alignment_of(case) == value


@pytest.mark.parametrize("axis", ["q alignment", "k alignment", "cache alignment"])
@pytest.mark.parametrize("value", alignment_axes.ALIGNMENTS)
def test_a_setter_moves_the_storage_offset_to_the_value(axis, value):
    flash = FlashCase(seed=0, tokens=2, heads=2, kv_heads=1, head_size=64, value_head_size=64, dtype="bfloat16",
                      kv_cache_dtype="auto", num_blocks=2, block_size=2, slots=SlotSpec(2),
                      table=TableSpec("plain", 64, 16))
    moved = AXIS[axis].set(flash, value)
    assert moved is not None and AXIS[axis].of(moved) == value
    _check_against_addresses(moved)
    assert AXIS[axis].set(_rope(18, 18), "16") is None  # R/2 = 9 (or no cache): no storage offset reaches it
