"""What memory must look like after an operation, from the float64 reference.

``expect(operation, built, impl)`` is computed before the operation runs. It starts
from a copy of every buffer (sentinels, pass-through data, untouched cache rows:
all expected bit for bit), writes in the reference's results, and marks the
elements §5 compares with a tolerance: rotated values (``RopeRegion``), fp8 codes
(``Fp8Region``), and cache entries that must equal what was written back
(``StoredCopy``). Which rows rotate follows the implementation's ``padded_rows``.
"""

from __future__ import annotations

import dataclasses

import torch

from mla_fuse_conformance.cases import tensors
from mla_fuse_conformance.judging.comparisons import Expectation, Fp8Region, RopeRegion, StoredCopy, rope_bound, rotation_terms
# ref_*: the reference's modules, apart from the product's and the suite's values of those names
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import ops as ref_ops
from mla_fuse_reference.rope import rope_exact


@dataclasses.dataclass
class Rows:
    """Per token: is its entry written (valid slot, inside slot_mapping)?"""

    written: torch.Tensor  # bool [T]

    @classmethod
    def of(cls, built: tensors.Built, tokens: int) -> "Rows":
        slots = reference_slots(built).cpu()
        written = torch.zeros(tokens, dtype=torch.bool)
        written[: slots.numel()] = slots >= 0
        return cls(written)

    def rotated(self, tensor: str, padded_rows: str) -> torch.Tensor:
        """Rows of q (``tensor == "q"``) or k the implementation promises to rotate."""
        everything = torch.ones_like(self.written)
        if padded_rows == "rotated" or (padded_rows == "q_only" and tensor == "q"):
            return everything
        return self.written


def reserved_slot(built: tensors.Built) -> int | None:
    """The reserved slot padded tokens point at (``SlotSpec.pad_value`` >= 0, SGLang's 0), or None."""
    slots = getattr(built.case, "slots", None)
    return slots.pad_value if slots is not None and slots.pad_value >= 0 else None


def reference_slots(built: tensors.Built) -> torch.Tensor:
    """``slot_mapping`` as the reference takes it: a reserved padding slot as -1 (nothing written)."""
    slots = built.args["slot_mapping"].long()
    reserved = reserved_slot(built)
    return slots if reserved is None else torch.where(slots == reserved, -1, slots)


def _start(built: tensors.Built) -> Expectation:
    expectation = Expectation(expected={name: buffer.flat.clone() for name, buffer in built.buffers.items()})
    reserved = reserved_slot(built)
    if reserved is not None:  # its contents are not judged (what padded tokens leave there is the engine's)
        for cache in ("kv_cache", "key_cache", "value_cache"):
            if cache in built.args:
                block_size = built.args[cache].size(1)
                index = built.index_map(cache, torch.tensor([reserved // block_size]),
                                        torch.tensor([reserved % block_size]))
                expectation.unjudged.setdefault(built.view_buffer[cache], []).append(index.flatten())
    return expectation


def _write(expectation: Expectation, built: tensors.Built, arg: str, values: torch.Tensor) -> None:
    """Put ``values`` where the view ``arg`` lies in the expected copy of its buffer."""
    buffer = built.buffer_of(arg)
    target = buffer.view(arg, expectation.expected[buffer.name])
    memory_bits = values.view(torch.uint8) if values.element_size() == 1 else values
    (target.view(torch.uint8) if target.element_size() == 1 else target).copy_(memory_bits)


def _heads(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``[T, heads, head_size]`` view of a ``[T, heads, head_size]`` or ``[T, heads * head_size]`` tensor."""
    if x.dim() == 3:
        return x
    return x.reshape(x.size(0), x.size(1) // head_size, head_size)


def _rope_region(expectation, built, arg: str, head_size: int, rows: torch.Tensor, rounding: str) -> torch.Tensor:
    """Mark the rotated part of ``arg``'s rows; return the exact rotation ``[T, heads, D]``."""
    tensor = _heads(built.args[arg], head_size)
    positions, table = built.args["positions"], built.args["cos_sin_cache"]
    rotary_dim = table.size(1)
    exact = rope_exact(positions, tensor, table, built.args["is_neox"]).cpu()
    terms = rotation_terms(positions, tensor[..., :rotary_dim], table, built.args["is_neox"]).cpu()
    index = _heads(built.index_map(arg), head_size)[..., :rotary_dim][rows]
    exact_rotated = exact[..., :rotary_dim][rows]
    bound = rope_bound(exact_rotated, terms[rows], tensor.dtype, rounding)
    expectation.rope.append(RopeRegion(built.view_buffer[arg], f"rotated {arg}", index.flatten(),
                                       exact_rotated.flatten(), bound.flatten(), tensor.dtype))
    return exact


def _entry_index(built: tensors.Built, cache: str, rows: Rows) -> torch.Tensor:
    """Flat indices of the cache entries the written tokens land in: ``[n, *entry shape]``."""
    slots = reference_slots(built).cpu()[: rows.written.numel()]
    valid = slots[rows.written[: slots.numel()]]
    block_size = built.args[cache].size(1)
    return built.index_map(cache, valid // block_size, valid % block_size)


def _exact_codes_region(expectation, built, cache: str, index: torch.Tensor, fmt: str, label: str) -> None:
    """fp8 codes of pass-through values: only the reference code is allowed."""
    ref = memory_codes(expectation, built, cache, index)
    expectation.fp8.append(Fp8Region(built.view_buffer[cache], label, index.flatten(), ref, ref, ref, fmt))


def memory_codes(expectation, built, cache: str, index: torch.Tensor) -> torch.Tensor:
    return expectation.expected[built.view_buffer[cache]].cpu().view(torch.uint8)[index.flatten()]


def _rotated_cache_part(expectation, built, cache: str, index, exact, bound, source: str, source_index,
                        fmt: str | None, scale: torch.Tensor | None, dtype, label: str) -> None:
    """Cache elements holding rotated k: within the rope bound (or its fp8 image), and equal to
    what was written back to ``source``."""
    cache_buffer = built.view_buffer[cache]
    if fmt is None:
        expectation.rope.append(RopeRegion(cache_buffer, label, index.flatten(), exact.flatten(), bound.flatten(),
                                           dtype))
    else:
        ref = memory_codes(expectation, built, cache, index)
        scale = scale.to(torch.float64).expand_as(exact)
        low = ref_fp8.encode(((exact - bound) / scale).flatten(), fmt)
        high = ref_fp8.encode(((exact + bound) / scale).flatten(), fmt)
        expectation.fp8.append(Fp8Region(cache_buffer, label, index.flatten(), ref, low, high, fmt))
    expectation.stored.append(StoredCopy(cache_buffer, index.flatten(), built.view_buffer[source],
                                         source_index.flatten(), fmt,
                                         None if scale is None else scale.flatten().to(torch.float32), label))


# ---------------------------------------------------------------- operations


def expect_rotary_embedding(built: tensors.Built, impl) -> Expectation:
    expectation = _start(built)
    head_size = built.args["head_size"]
    for arg in ("query", "key"):
        if built.args[arg] is not None:
            rows = torch.ones(built.args[arg].size(0), dtype=torch.bool)
            _rope_region(expectation, built, arg, head_size, rows, impl.rounding)
    return expectation


def expect_concat_and_cache_mla(built: tensors.Built, impl) -> Expectation:
    expectation = _start(built)
    a = built.args
    new_cache = ref_ops.concat_and_cache_mla(a["kv_c"], a["k_pe"], a["kv_cache"], reference_slots(built),
                                             a["kv_cache_dtype"], a["scale"])
    _write(expectation, built, "kv_cache", new_cache)
    fmt = tensors.fp8_format(a["kv_cache_dtype"])
    if fmt is not None:
        index = _entry_index(built, "kv_cache", Rows.of(built, a["kv_c"].size(0)))
        _exact_codes_region(expectation, built, "kv_cache", index, fmt, "kv_cache entries")
    return expectation


def expect_concat_and_cache_mla_rope_fused(built: tensors.Built, impl) -> Expectation:
    expectation = _start(built)
    a = built.args
    T, L, R = a["kv_c"].size(0), a["kv_c"].size(1), a["k_pe"].size(1)
    rows = Rows.of(built, T)
    _, _, new_cache = ref_ops.concat_and_cache_mla_rope_fused(
        a["positions"], a["q_pe"], a["k_pe"], a["kv_c"], a["cos_sin_cache"], a["is_neox"], reference_slots(built),
        a["kv_cache"], a["kv_cache_dtype"], a["scale"])
    _write(expectation, built, "kv_cache", new_cache)
    _rope_region(expectation, built, "q_pe", R, rows.rotated("q", impl.padded_rows), impl.rounding)
    k_exact = _rope_region(expectation, built, "k_pe", R, rows.rotated("k", impl.padded_rows), impl.rounding)
    fmt = tensors.fp8_format(a["kv_cache_dtype"])
    entries = _entry_index(built, "kv_cache", rows)
    if fmt is not None:
        _exact_codes_region(expectation, built, "kv_cache", entries[:, :L], fmt, "kv_cache latent part")
    k_written = k_exact[:, 0][rows.written]
    terms = rotation_terms(a["positions"], a["k_pe"][:, None, :], a["cos_sin_cache"], a["is_neox"]).cpu()[:, 0]
    bound = rope_bound(k_written, terms[rows.written], a["k_pe"].dtype, impl.rounding)
    _rotated_cache_part(expectation, built, "kv_cache", entries[:, L:], k_written, bound, "k_pe",
                        built.index_map("k_pe")[rows.written], fmt, a["scale"].cpu(), a["k_pe"].dtype,
                        "kv_cache rotated k_pe part")
    return expectation


def expect_reshape_and_cache_flash(built: tensors.Built, impl) -> Expectation:
    expectation = _start(built)
    a = built.args
    new_key_cache, new_value_cache = ref_ops.reshape_and_cache_flash(
        a["key"], a["value"], a["key_cache"], a["value_cache"], reference_slots(built), a["kv_cache_dtype"],
        a["k_scale"], a["v_scale"])
    _write(expectation, built, "key_cache", new_key_cache)
    _write(expectation, built, "value_cache", new_value_cache)
    fmt = tensors.fp8_format(a["kv_cache_dtype"])
    if fmt is not None:
        rows = Rows.of(built, a["key"].size(0))
        for cache in ("key_cache", "value_cache"):
            _exact_codes_region(expectation, built, cache, _entry_index(built, cache, rows), fmt, f"{cache} entries")
    return expectation


def expect_rope_and_reshape_and_cache_flash(built: tensors.Built, impl) -> Expectation:
    expectation = _start(built)
    a = built.args
    T, D, R = a["key"].size(0), a["key"].size(2), a["cos_sin_cache"].size(1)
    rows = Rows.of(built, T)
    _, _, new_key_cache, new_value_cache = ref_ops.rope_and_reshape_and_cache_flash(
        a["positions"], a["query"], a["key"], a["value"], a["key_cache"], a["value_cache"], reference_slots(built),
        a["cos_sin_cache"], a["is_neox"], a["kv_cache_dtype"], a["k_scale"], a["v_scale"])
    _write(expectation, built, "key_cache", new_key_cache)
    _write(expectation, built, "value_cache", new_value_cache)
    _rope_region(expectation, built, "query", D, rows.rotated("q", impl.padded_rows), impl.rounding)
    k_exact = _rope_region(expectation, built, "key", D, rows.rotated("k", impl.padded_rows), impl.rounding)
    fmt = tensors.fp8_format(a["kv_cache_dtype"])
    key_entries = _entry_index(built, "key_cache", rows)
    if fmt is None:  # the unrotated tail is pass-through: the input's bits (NaN payloads included)
        tail = built.index_map("key")[rows.written][..., R:].flatten()
        source = expectation.expected[built.view_buffer["key"]].cpu()[tail]
        expectation.expected[built.view_buffer["key_cache"]][key_entries[..., R:].flatten()] = source.to(
            expectation.expected[built.view_buffer["key_cache"]].device)
    else:
        _exact_codes_region(expectation, built, "key_cache", key_entries[..., R:], fmt, "key_cache unrotated tail")
        _exact_codes_region(expectation, built, "value_cache", _entry_index(built, "value_cache", rows), fmt,
                            "value_cache entries")
    k_written = k_exact[rows.written][..., :R]
    terms = rotation_terms(a["positions"], a["key"][..., :R], a["cos_sin_cache"], a["is_neox"]).cpu()
    bound = rope_bound(k_written, terms[rows.written], a["key"].dtype, impl.rounding)
    scale = a["k_scale"].cpu().reshape(1, -1, 1)
    _rotated_cache_part(expectation, built, "key_cache", key_entries[..., :R], k_written, bound, "key",
                        built.index_map("key")[rows.written][..., :R], fmt, scale, a["key"].dtype,
                        "key_cache rotated part")
    return expectation


# operation -> its expectation, ``expect_<operation>``
# What memory must hold after each operation (tests/test_suite_checks.py: exactly the OPERATIONS).
EXPECT = {
    "rotary_embedding": expect_rotary_embedding,
    "concat_and_cache_mla": expect_concat_and_cache_mla,
    "concat_and_cache_mla_rope_fused": expect_concat_and_cache_mla_rope_fused,
    "reshape_and_cache_flash": expect_reshape_and_cache_flash,
    "rope_and_reshape_and_cache_flash": expect_rope_and_reshape_and_cache_flash,
}


def expect(operation: str, built: tensors.Built, impl) -> Expectation:
    return EXPECT[operation](built, impl)


def saturated_fraction(expectation: Expectation) -> float:
    """Fraction of the reference's fp8 codes that are the saturation code (for target() and events)."""
    total = saturated = 0
    for region in expectation.fp8:
        magnitude = region.ref.to(torch.int64) & 0x7F
        max_code = 0x7E if region.fmt == "e4m3" else 0x7B
        total += magnitude.numel()
        saturated += int((magnitude == max_code).sum())
    return saturated / total if total else 0.0

