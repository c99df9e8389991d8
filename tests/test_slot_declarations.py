"""The reserved padding slot and the block sizes a declaration may name (``Capabilities.padding_slot``, ``block_sizes``; issue 44 item 6): SGLang
points padded tokens at its reserved slot 0 instead of -1. Declared, drawn cases pad with that slot, give it
to no token, and do not judge its contents; undeclared, a kernel that never writes slot 0 fails where a token
has slot 0, and the value condition ``slot 0 given to a token`` names it. SGLang's deployments pad as SGLang
pads. Planted kernels in torch, no third party needed; a second.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch


class SkipsSlotZero:
    """A planted MLA write in torch that never writes slot 0 (SGLang's reserved_skip_index)."""

    rounding, padded_rows, checks_inputs = "single", "rotated", False

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        rows = kv_cache.view(-1, kv_cache.shape[-1])
        for token, slot in enumerate(slot_mapping.tolist()):
            if slot > 0:
                rows[slot] = torch.cat([kv_c[token], k_pe[token]])


class WritesEverySlot(SkipsSlotZero):
    """A planted MLA write that writes padded tokens into the reserved slot too (as SGLang's fused flash kernel
    does: ``if pid_slot >= 0``), leaving whatever they hold there."""

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        rows = kv_cache.view(-1, kv_cache.shape[-1])
        for token, slot in enumerate(slot_mapping.tolist()):
            rows[slot] = torch.cat([kv_c[token], k_pe[token]])


def _judge(capabilities, placement, padding="some", kernel=SkipsSlotZero):
    from mla_fuse_conformance.cases import fields, tensors
    from mla_fuse_conformance.cases.types import MlaCase, SlotSpec, TableSpec
    from mla_fuse_conformance.judging import comparisons, oracle

    case = MlaCase(seed=3, tokens=6, heads=1, latent=6, rotary_dim=4, dtype="bfloat16", kv_cache_dtype="auto",
                   num_blocks=3, block_size=4, slots=SlotSpec(6, padding=padding, placement=placement),
                   table=TableSpec("plain", 4, 64))
    case = capabilities.project(case, rotates=False)
    built = tensors.build(case, "cpu")
    expectation = oracle.expect("concat_and_cache_mla", built, kernel())
    a = built.args
    kernel().concat_and_cache_mla(a["kv_c"], a["k_pe"], a["kv_cache"], a["slot_mapping"], "auto", a["scale"])
    outcome = comparisons.compare(built.buffers, {n: b.flat.clone() for n, b in built.buffers.items()}, expectation)
    return built, outcome, fields.relations(built)


@pytest.mark.parametrize("kernel", [SkipsSlotZero, WritesEverySlot])
def test_a_reserved_slot_kernel_declared_as_such_passes(kernel):
    """Declared ``padding_slot=0``: padded tokens point at slot 0, no token is given it, its row is not judged."""
    from mla_fuse_conformance.contract.capabilities import Capabilities

    declared = Capabilities(padding_slot=0)
    built, outcome, _ = _judge(declared, "extremes", "some", kernel)
    assert (built.args["slot_mapping"] == 0).any() and not outcome.failures, outcome.failures
    built, outcome, _ = _judge(declared, "extremes", "none", kernel)  # extremes: the first usable and last slot
    assert 0 not in built.args["slot_mapping"].tolist() and not outcome.failures, outcome.failures
    assert declared.describe()[-1].startswith("padding slot: reserved slot 0")


def test_a_reserved_slot_kernel_undeclared_fails_at_slot_zero():
    """Undeclared (the contract's -1): a token given slot 0 is never written, and the failure names slot 0's
    entry; a case padding with 0 is outside the contract's declaration."""
    from mla_fuse_conformance.contract.capabilities import CONTRACT

    built, outcome, _ = _judge(CONTRACT, "extremes", "none")
    assert (built.args["slot_mapping"] == 0).any() and outcome.failures
    assert any("kv_cache[0, 0" in failure for failure in outcome.failures), outcome.failures
    padded_with_zero = dataclasses.replace(built.case, slots=dataclasses.replace(built.case.slots, padding="some",
                                                                                 pad_value=0))
    assert CONTRACT.violations(padded_with_zero, rotates=False) == {"padding slot": "0"}


def test_the_map_can_name_slot_zero():
    """The value condition a cell of the undeclared kernel is located by (``fields.relations``): a real token
    given slot 0; false where slot 0 is the declared padding slot."""
    from mla_fuse_conformance.contract.capabilities import CONTRACT, Capabilities

    for capabilities, padding, named in ((CONTRACT, "none", True), (Capabilities(padding_slot=0), "some", False)):
        _, _, relations = _judge(capabilities, "extremes", padding)
        assert relations["slot 0 given to a token"] == named


def test_sglang_deployments_pad_as_sglang_pads():
    """SGLang's deployment cases never give a token its reserved slot 0; vLLM's may use slot 0."""
    from mla_fuse_conformance.cases import deployment_cases, tensors
    from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS

    for deployment in DEPLOYMENTS:
        if deployment.layout.startswith("sglang"):
            _, slots = deployment_cases.batch_specs(deployment)
            assert slots.pad_value == 0, deployment.name
            values, unused = tensors.slot_values(slots, deployment.num_blocks() * deployment.block_size,
                                                 torch.Generator().manual_seed(0), deployment.block_size)
            assert 0 not in values.tolist() and 0 not in unused.tolist(), deployment.name


# ---------------------------------------------------------------- block sizes


def test_declared_block_sizes_move_a_case_onto_them_with_as_many_slots():
    """``block_sizes`` (SGLang's fused flash write asserts a power of two): a drawn B moves to the nearest listed
    one, the cache keeping at least as many slots; a case outside is a violation named ``block size``."""
    from mla_fuse_conformance.cases.types import FlashCase, SlotSpec, TableSpec
    from mla_fuse_conformance.contract.capabilities import Capabilities

    powers = Capabilities(block_sizes=(1, 2, 4, 8, 16))
    case = FlashCase(seed=1, tokens=5, heads=2, kv_heads=1, head_size=8, value_head_size=8, dtype="float32",
                     kv_cache_dtype="auto", num_blocks=3, block_size=6, slots=SlotSpec(5), table=TableSpec("plain", 8,
                                                                                                         16))
    assert powers.violations(case) == {"block size": "6"}
    moved = powers.project(case)
    assert moved.block_size in (4, 8) and moved.num_blocks * moved.block_size >= 18 and powers.allows(moved)
    assert "block size: only 1, 2, 4, 8, 16" in powers.describe()
