"""mla_fuse's Triton kernels as vectorized torch code: the ``triton-cpu-fast`` implementation.

Under Triton's interpreter a kernel launch costs a fixed Python overhead per Triton
operation and about 20 ns per element loaded or stored: over half of a CPU worker's time
on the properties that launch kernels (docs/THROUGHPUT.md). This module is a twin of
``mla_fuse/kernels/``: the same stages, in the same order, with the same arithmetic,
written as whole-tensor torch operations (the fused MLA op 6x faster than interpreted at
T=64, H=16; up to 2.4x more examples per second on the properties), with the same semantics:

* RoPE: ``a' = a*c - b*s``, ``b' = b*c + a*s``, each product and the difference or sum
  one IEEE fp32 operation (the kernels compile without FMA contraction), then one
  rounding to the row's dtype;
* every rounding and fp8 encoding is the kernels' integer arithmetic on the fp32 bit
  pattern (``mla_fuse/kernels/conversions.py``), done here in int64, never a torch cast
  (torch's casts round NaN payloads, and on some CPUs subnormals, differently);
* cache writes go through integer views of the caches (bits copied, never converted),
  at ``slot // B, slot % B`` for ``t < len(slot_mapping)`` with ``slot >= 0``.

Bad input is rejected by the same checks as ``mla_fuse.ops`` (``mla_fuse.validation``)
before anything is written. ``tests/test_fast_cpu_path.py`` runs both on the suite's
cases and fails on any differing bit of any buffer, so what the suite finds with it holds
for the kernels (replay a found case with ``--impl triton``). Use it as ``--impl
triton-cpu-fast``; the kernels themselves stay the default and are tested in CI.
"""

from __future__ import annotations

import torch

from mla_fuse import validation

from mla_fuse_conformance.declarations.operations import OPERATION_ARGUMENTS

U32 = 0xFFFFFFFF
F32_ABS = 0x7FFFFFFF
F32_INF = 0x7F800000
INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
# fp8 format -> (mantissa bits, exponent bias, largest finite code), as conversions.quantize
FP8_FORMATS = {"e4m3": (3, 7, 0x7E), "e5m2": (2, 15, 0x7B)}


# ---------------------------------------------------------------- bit patterns (int64 holds uint32)


def float32_bits(x: torch.Tensor) -> torch.Tensor:
    """The IEEE bits of fp32 ``x`` as int64 in ``[0, 2^32)``."""
    return x.view(torch.int32).to(torch.int64) & U32


def from_bits(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int64 holding an unsigned bit pattern of ``dtype``'s width -> a ``dtype`` tensor of those bits."""
    width = 8 * dtype.itemsize
    signed = torch.where(bits >= 1 << (width - 1), bits - (1 << width), bits)
    return signed.to(INT_OF_SIZE[dtype.itemsize]).view(dtype)


def int_view(x: torch.Tensor) -> torch.Tensor:
    """``x``'s bits as an integer tensor of the same shape, strides and storage."""
    return x.view(INT_OF_SIZE[x.element_size()])


# ---------------------------------------------------------------- conversions.py


def widen_to_float32(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16/fp32 -> fp32, exactly (bf16: the bits shifted left by 16)."""
    if x.dtype == torch.bfloat16:
        return from_bits((int_view(x).to(torch.int64) & 0xFFFF) << 16, torch.float32)
    return x.to(torch.float32)


def round_float32(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``x`` rounded once (RNE) to ``dtype``: ``conversions.round_float32``, step for step."""
    if dtype == torch.bfloat16:
        return from_bits(_round_to_bfloat16_bits(float32_bits(x)), dtype)
    if dtype == torch.float16:
        return from_bits(_round_to_float16_bits(x, float32_bits(x)), dtype)
    return x


def _round_to_bfloat16_bits(bits: torch.Tensor) -> torch.Tensor:
    # RNE drop of 16 bits; NaN -> the high half with the quiet bit set
    high = bits >> 16
    rounded = (bits + 0x7FFF + (high & 1)) >> 16
    return torch.where((bits & F32_ABS) > F32_INF, high | 0x0040, rounded)


def _round_to_float16_bits(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    magnitude = bits & F32_ABS
    # normal: RNE drop of 13 bits, rebias 127 -> 15, clamp at inf (0x7C00)
    half = ((magnitude + 0x0FFF + ((magnitude >> 13) & 1)) >> 13) - (112 << 10)
    half = torch.clamp(half, max=0x7C00)
    # subnormal (|x| < 2^-14): the low bits of the fp32 sum |x| + 0.5 (ulp 2^-24)
    small = from_bits(torch.clamp(magnitude, max=0x38800000), torch.float32)
    subnormal = float32_bits(small + 0.5) - 0x3F000000
    half = torch.where(magnitude < 0x38800000, subnormal, half)
    half = torch.where(magnitude > F32_INF, 0x7E00, half)
    return half | ((bits >> 16) & 0x8000)


def quantize(x: torch.Tensor, scale: torch.Tensor, fp8_format: str) -> torch.Tensor:
    """``code = fp8(clamp(float32(x) / scale))`` as uint8: ``conversions.quantize``, step for step."""
    mantissa_bits, bias, max_finite_code = FP8_FORMATS[fp8_format]
    dropped = 23 - mantissa_bits
    min_normal_bits = (128 - bias) << 23
    magic, magic_bits = 2.0 ** (24 - bias - mantissa_bits), (151 - bias - mantissa_bits) << 23
    bits = float32_bits(widen_to_float32(x) / scale)  # IEEE division
    magnitude = bits & F32_ABS
    # normal: RNE drop, rebias 127 -> bias, satfinite
    code = ((magnitude + (1 << (dropped - 1)) - 1 + ((magnitude >> dropped) & 1)) >> dropped)
    code = torch.clamp(code - ((127 - bias) << mantissa_bits), max=max_finite_code)
    # subnormal: the low bits of the fp32 sum |q| + MAGIC
    small = from_bits(torch.clamp(magnitude, max=min_normal_bits), torch.float32)
    code = torch.where(magnitude < min_normal_bits, float32_bits(small + magic) - magic_bits, code)
    code = torch.where(magnitude > F32_INF, 0x7F, code)  # NaN -> 0x7F | sign
    return (code | ((bits >> 24) & 0x80)).to(torch.uint8)


def stored(x: torch.Tensor, fp8_format: str | None, scale: torch.Tensor) -> torch.Tensor:
    """What a cache holds for ``x``: its bits, or its fp8 codes (``scale`` broadcasts against ``x``)."""
    return int_view(x) if fp8_format is None else quantize(x, scale, fp8_format)


# ---------------------------------------------------------------- rotation.py


def cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``cos, sin [T, 1, R/2]``: the halves of row ``positions[t]`` of the table."""
    rows = widen_to_float32(cos_sin_cache[positions.to(torch.int64)])
    cos, sin = rows.chunk(2, dim=-1)
    return cos[:, None], sin[:, None]


def rotate_in_place(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int,
                    is_neox: bool) -> None:
    """Rotate the first ``rotary_dim`` elements of every head of ``heads [T, H, D]`` in place."""
    rotary = heads[..., :rotary_dim]
    if is_neox:
        a, b = rotary.chunk(2, dim=-1)
    else:
        a, b = rotary.unflatten(-1, (rotary_dim // 2, 2)).unbind(-1)
    a, b = widen_to_float32(a), widen_to_float32(b)
    # a' = a*c - b*s ; b' = b*c + a*s  (fp32, one rounding each)
    a_new = round_float32(a * cos - b * sin, heads.dtype)
    b_new = round_float32(b * cos + a * sin, heads.dtype)
    rotated = torch.cat((a_new, b_new), -1) if is_neox else torch.stack((a_new, b_new), -1).flatten(-2)
    int_view(rotary).copy_(int_view(rotated))


def as_heads(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """``[T, H, hs]`` as is, ``[T, H * hs]`` as a ``[T, H, hs]`` view."""
    return x if x.dim() == 3 else x.unflatten(1, (x.size(1) // head_size, head_size))


# ---------------------------------------------------------------- indexing.py


def written_slots(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens that write, their slots): ``t < len(slot_mapping)`` with ``slot >= 0``."""
    slots = slot_mapping.to(torch.int64)
    tokens = (slots >= 0).nonzero().squeeze(1)
    return tokens, slots[tokens]


def write_entries(cache: torch.Tensor, slots: torch.Tensor, values: torch.Tensor) -> None:
    """``cache[slot // B, slot % B] = values`` through the cache's own strides."""
    block_size = cache.size(1)
    cache[slots // block_size, slots % block_size] = values


def cache_bits(cache: torch.Tensor, fp8_format: str | None) -> torch.Tensor:
    """The cache as the integer tensor its entries are written through (uint8 codes for fp8)."""
    return cache.view(torch.uint8) if fp8_format is not None else int_view(cache)


def head_scales(scale: torch.Tensor) -> torch.Tensor:
    """``[1]`` or ``[Hkv]`` fp32 scales, broadcasting against ``[tokens, Hkv, D]``."""
    return scale.reshape(-1)[None, :, None]


# ---------------------------------------------------------------- the five operations (the kernel files)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, *, check_values=None) -> None:
    validation.check_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox,
                                      check_values=check_values)
    _rope(positions, query, key, head_size, cos_sin_cache, is_neox)


def _rope(positions, query, key, head_size, cos_sin_cache, is_neox) -> None:
    cos, sin = cos_sin(positions, cos_sin_cache)
    for x in (query, key):
        if x is not None:
            rotate_in_place(as_heads(x, head_size), cos, sin, cos_sin_cache.size(1), is_neox)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *, check_values=None) -> None:
    validation.check_concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                                          check_values=check_values)
    _mla_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


def _mla_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale) -> None:
    tokens, slots = written_slots(slot_mapping)
    fp8_format = validation.fp8_format(kv_cache_dtype)
    entry = torch.cat((stored(kv_c[tokens], fp8_format, scale), stored(k_pe[tokens], fp8_format, scale)), -1)
    write_entries(cache_bits(kv_cache, fp8_format), slots, entry)


def concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache,
                                    kv_cache_dtype, kv_cache_scale, *, check_values=None) -> None:
    validation.check_concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox,
                                                     slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale,
                                                     check_values=check_values)
    # every row rotated; the cache gets the rotated k_pe as written back
    _rope(positions, q_pe, k_pe[:, None], k_pe.size(1), cos_sin_cache, is_neox)
    _mla_write(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, kv_cache_scale)


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, *,
                            check_values=None) -> None:
    validation.check_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                             k_scale, v_scale, check_values=check_values)
    _flash_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def _flash_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale) -> None:
    tokens, slots = written_slots(slot_mapping)
    fp8_format = validation.fp8_format(kv_cache_dtype)
    for source, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        write_entries(cache_bits(cache, fp8_format), slots, stored(source[tokens], fp8_format, head_scales(scale)))


def rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache, slot_mapping,
                                     cos_sin_cache, is_neox, kv_cache_dtype, k_scale, v_scale, *,
                                     check_values=None) -> None:
    validation.check_rope_and_reshape_and_cache_flash(positions, query, key, value, key_cache, value_cache,
                                                      slot_mapping, cos_sin_cache, is_neox, kv_cache_dtype,
                                                      k_scale, v_scale, check_values=check_values)
    # every row rotated; the key cache gets the rotated key as written back (its tail passes through)
    _rope(positions, query, key, key.size(2), cos_sin_cache, is_neox)
    _flash_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


class TritonCpuFastImplementation:
    """The twin of ``triton``: the same declarations, the same bits, without the interpreter."""

    name = "triton-cpu-fast"
    rounding = "single"
    padded_rows = "rotated"
    checks_inputs = True
    # per operation, the call a standalone reproducer inlines (commands/repro/script.py)
    call_source = {op: f"from mla_fuse_conformance.adapters import triton_cpu_fast\n"
                       f"triton_cpu_fast.{op}({', '.join(arguments)})" for op, arguments in OPERATION_ARGUMENTS.items()}

    rotary_embedding = staticmethod(rotary_embedding)
    concat_and_cache_mla = staticmethod(concat_and_cache_mla)
    concat_and_cache_mla_rope_fused = staticmethod(concat_and_cache_mla_rope_fused)
    reshape_and_cache_flash = staticmethod(reshape_and_cache_flash)
    rope_and_reshape_and_cache_flash = staticmethod(rope_and_reshape_and_cache_flash)
