"""How results are compared: CONTRACT §5, and nothing looser.

* Rotated values: ``|impl - exact| <= ulp_out(exact) + 2^-22 * (|a*c| + |b*s|)`` for
  ``rounding="single"``; ``"per_op"`` adds ``2 * u_out * (|a*c| + |b*s|)``. ``exact`` is the
  unrounded float64 rotation; NaN exactly where it is NaN; never inf where it is finite.
* fp8 codes: ordered integers (sign-magnitude to ordinal). A code must lie in the interval
  of codes the reference allows: the reference code, widened by the codes of every
  quotient the input may legitimately take (none for pass-through values: exact; for
  rotated k, the image of the rope bound, usually at most one step). It has the reference's
  sign where the interval has one sign, NaN exactly where the reference is NaN (any NaN
  code equals any other), never an infinity. Exact saturation follows: a quotient beyond
  the finite max allows only the max code. (CONTRACT §5's "within one step everywhere"
  holds wherever the bound spans at most one step; where cancellation makes it span more,
  as under ``per_op`` rounding, the interval rules, and the cache must in any case hold
  exactly ``quantize(k written back)``.)
* Everything else, the sentinel memory around every view included: bit for bit.

Assertion messages name the worst element (the view and index it is), the values, the
bound and how many elements fail; an fp8 element as its decoded value and its code, in hex and
decimal (``-240 (code 0xf7 = 247)``), as a reproducer prints it. The same worst elements travel
as data on the AssertionError (``mla_fuse_record["worst"]``, see ``Outcome.worst``) into the
failure file and report.json.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from mla_fuse_conformance.cases import memory
# ref_*: the reference's modules, apart from the product's and the suite's values of those names
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference.rope import pair_indices
from mla_fuse_reference.rounding import FLOAT_FORMATS

SINGLE_ROUNDING_SLACK = 2.0 ** -22


# ---------------------------------------------------------------- the rotated-value bound


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype``'s grid at ``|values|`` (float64; subnormals share the smallest normal's)."""
    mantissa_bits, min_exponent, _ = FLOAT_FORMATS[dtype]
    exponent = torch.frexp(values.to(torch.float64).abs()).exponent - 1
    exponent = torch.clamp(exponent, min=min_exponent)
    return torch.ldexp(torch.ones_like(values, dtype=torch.float64), (exponent - mantissa_bits).to(torch.float64))


def unit_roundoff(dtype: torch.dtype) -> float:
    return 2.0 ** -(FLOAT_FORMATS[dtype][0] + 1)


def rotation_terms(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor,
                   is_neox: bool) -> torch.Tensor:
    """``|a*c| + |b*s|`` (first of a pair) and ``|b*c| + |a*s|`` (second), float64 ``[T, heads, R]``."""
    rotary_dim = cos_sin_cache.size(1)
    rows = cos_sin_cache.to(torch.float64)[positions.long()]
    cos, sin = rows[:, None, : rotary_dim // 2].abs(), rows[:, None, rotary_dim // 2:].abs()
    first, second = pair_indices(rotary_dim, is_neox)
    x64 = x.to(torch.float64)
    a, b = x64[..., first].abs(), x64[..., second].abs()
    terms = torch.empty(*x.shape[:-1], rotary_dim, dtype=torch.float64, device=x.device)
    terms[..., first] = a * cos + b * sin
    terms[..., second] = b * cos + a * sin
    return terms


def rope_bound(exact: torch.Tensor, terms: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """The CONTRACT §5 bound on ``|impl - exact|`` for rotated values."""
    bound = ulp(exact, dtype) + SINGLE_ROUNDING_SLACK * terms
    if rounding == "per_op":
        bound = bound + 2 * unit_roundoff(dtype) * terms
    return bound


# ---------------------------------------------------------------- fp8 codes as ordered integers


def fp8_is_nan(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    magnitude = codes.to(torch.int64) & 0x7F
    return magnitude == 0x7F if fmt == "e4m3" else magnitude > 0x7C


def fp8_is_inf(codes: torch.Tensor, fmt: str) -> torch.Tensor:
    magnitude = codes.to(torch.int64) & 0x7F
    return torch.zeros_like(magnitude, dtype=torch.bool) if fmt == "e4m3" else magnitude == 0x7C


def fp8_ordinal(codes: torch.Tensor) -> torch.Tensor:
    """Sign-magnitude code to an ordered integer: adjacent values differ by one; +0 and -0 are 0."""
    codes = codes.to(torch.int64)
    magnitude = codes & 0x7F
    return torch.where(codes & 0x80 != 0, -magnitude, magnitude)


def fp8_sign(codes: torch.Tensor) -> torch.Tensor:
    return (codes.to(torch.int64) & 0x80) != 0


# ---------------------------------------------------------------- what is expected where


@dataclasses.dataclass
class RopeRegion:
    """Rotated elements at ``index`` (flat, in ``buffer``): within ``bound`` of ``exact``."""

    buffer: str
    label: str
    index: torch.Tensor
    exact: torch.Tensor
    bound: torch.Tensor
    dtype: torch.dtype


@dataclasses.dataclass
class Fp8Region:
    """fp8 codes at ``index``: the reference code ``ref`` and the allowed interval ``[low, high]``."""

    buffer: str
    label: str
    index: torch.Tensor
    ref: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor
    fmt: str


@dataclasses.dataclass
class StoredCopy:
    """Cache elements that must hold exactly what the operation wrote back to its source
    (CONTRACT §2: the k stored is the same rounded value written back): the source bits,
    or ``quantize(source, scale)`` for fp8."""

    cache_buffer: str
    cache_index: torch.Tensor
    source_buffer: str
    source_index: torch.Tensor
    fmt: str | None
    scale: torch.Tensor | None
    label: str


@dataclasses.dataclass
class Expectation:
    expected: dict[str, torch.Tensor]  # buffer -> flat bits expected wherever no region says otherwise
    rope: list[RopeRegion] = dataclasses.field(default_factory=list)
    fp8: list[Fp8Region] = dataclasses.field(default_factory=list)
    stored: list[StoredCopy] = dataclasses.field(default_factory=list)
    # buffer -> flat indices not judged at all (a reserved padding slot's entry, Capabilities.padding_slot)
    unjudged: dict[str, list[torch.Tensor]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Outcome:
    """What a comparison measured (folded into its property's metrics by ``running/recording.py``)."""

    worst_rope_ulps: float = 0.0
    worst_rope_bound_fraction: float = 0.0  # |impl - exact| / bound: 1 is the edge of failing
    worst_fp8_code_diff: int = 0
    rotated_elements: int = 0
    fp8_codes: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    # per failed check its worst element: {check, argument, index, got, expected, got_code, expected_code,
    # failing, of} (values decoded, NaN and infinities as text; codes: fp8 codes as integers, else None)
    worst: list[dict] = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------- checks


def _worst(description: str, buffer: memory.Buffer, flat_index: int, count: int, total: int, detail: str) -> str:
    return (f"{description}: {count} of {total} elements fail; worst at {buffer.locate(flat_index)}: {detail}")


def _number(value) -> float | str:
    """A JSON-safe number: NaN and infinities as text."""
    value = float(value)
    return value if math.isfinite(value) else repr(value)


def fp8_text(code: int, fmt: str) -> str:
    """An fp8 code as the messages show it: its value, then the code in hex and decimal."""
    value = ref_fp8.decode(torch.tensor([code], dtype=torch.uint8), fmt).item()
    return f"{value:.6g} (code 0x{code:02x} = {code})"


def _fail(outcome: Outcome, description: str, buffer: memory.Buffer, flat_index: int, count: int, total: int,
          detail: str, got, expected, codes: tuple[int, int] | None = None) -> None:
    """One failed check: its message line and its worst element as data (``Outcome.worst``)."""
    outcome.failures.append(_worst(description, buffer, flat_index, count, total, detail))
    found = buffer.position(flat_index)
    argument, index = found if found is not None else (f"{buffer.name} storage", [flat_index])
    outcome.worst.append({"check": description, "argument": argument, "index": index, "got": _number(got),
                          "expected": _number(expected), "got_code": codes and codes[0],
                          "expected_code": codes and codes[1], "failing": count, "of": total})


def check_bitwise(buffers: dict[str, memory.Buffer], after: dict[str, torch.Tensor],
                  expectation: Expectation, outcome: Outcome) -> None:
    """Every element no region covers holds exactly the expected bits."""
    covered: dict[str, torch.Tensor] = {}
    for region in [*expectation.rope, *expectation.fp8]:
        mask = covered.setdefault(region.buffer, torch.zeros(after[region.buffer].numel(), dtype=torch.bool))
        mask[region.index] = True
    for name, indices in expectation.unjudged.items():
        mask = covered.setdefault(name, torch.zeros(after[name].numel(), dtype=torch.bool))
        for index in indices:
            mask[index] = True
    for name, expected in expectation.expected.items():
        actual_bits, expected_bits = memory.bits(after[name]), memory.bits(expected.cpu())
        differs = actual_bits != expected_bits
        if name in covered:
            differs &= ~covered[name]
        if differs.any():
            where = differs.nonzero().flatten()
            first = int(where[0])
            width = 2 * after[name].element_size()
            _fail(outcome, f"bits changed that must not (sentinel, pass-through or cache data) in buffer '{name}'",
                  buffers[name], first, where.numel(), differs.numel(),
                  f"expected 0x{int(expected_bits[first]) & (2 ** (4 * width) - 1):0{width}x} "
                  f"({float(expected[first]):.6g}), got 0x{int(actual_bits[first]) & (2 ** (4 * width) - 1):0{width}x} "
                  f"({float(after[name][first]):.6g})", after[name][first], expected[first])


def check_rope(buffers, after, region: RopeRegion, outcome: Outcome) -> None:
    actual = after[region.buffer][region.index].to(torch.float64)
    exact = region.exact.cpu()
    bound = region.bound.cpu()
    nan_expected = torch.isnan(exact)
    error = torch.where(actual == exact, 0.0, (actual - exact).abs())  # equal infinities are no error
    bad = torch.isnan(actual) != nan_expected
    bad |= ~nan_expected & ~(error <= bound)  # also catches inf and NaN where a number is due
    outcome.rotated_elements += actual.numel()
    finite = ~nan_expected & torch.isfinite(actual)
    if finite.any():
        ulps = (error[finite] / ulp(exact[finite], region.dtype)).max().item()
        outcome.worst_rope_ulps = max(outcome.worst_rope_ulps, ulps)
        fraction = (error[finite] / bound[finite]).max().item()
        outcome.worst_rope_bound_fraction = max(outcome.worst_rope_bound_fraction, fraction)
    if bad.any():  # the worst numeric violation; a NaN mismatch only when there is none
        excess = torch.where(bad, torch.nan_to_num((error - bound) / bound, nan=-0.5, posinf=1e300), -1.0)
        worst = int(excess.argmax())
        ulps = (error[worst] / ulp(exact[worst:worst + 1], region.dtype)[0]).item()
        _fail(outcome, f"rotated values outside the CONTRACT §5 bound ({region.label})", buffers[region.buffer],
              int(region.index[worst]), int(bad.sum()), bad.numel(),
              f"impl {actual[worst].item():.9g}, exact {exact[worst].item():.9g}, |diff| {error[worst].item():.3g} > "
              f"bound {bound[worst].item():.3g} ({ulps:.3g} ulp)", actual[worst], exact[worst])


def check_fp8(buffers, after, region: Fp8Region, outcome: Outcome) -> None:
    actual = memory.bits(after[region.buffer])[region.index].to(torch.uint8)
    ref, low, high = region.ref.cpu(), region.low.cpu(), region.high.cpu()
    fmt = region.fmt
    ref_nan = fp8_is_nan(ref, fmt)
    actual_nan = fp8_is_nan(actual, fmt)
    o_actual, o_ref = fp8_ordinal(actual), fp8_ordinal(ref)
    o_low = torch.minimum(torch.minimum(fp8_ordinal(low), fp8_ordinal(high)), o_ref)
    o_high = torch.maximum(torch.maximum(fp8_ordinal(low), fp8_ordinal(high)), o_ref)
    one_sign = (fp8_sign(low) == fp8_sign(high)) & (fp8_sign(low) == fp8_sign(ref))
    numeric = ~ref_nan & ~actual_nan
    diff = (o_actual - o_ref).abs()
    bad = (ref_nan != actual_nan) | fp8_is_inf(actual, fmt)
    bad |= numeric & ((o_actual < o_low) | (o_actual > o_high))
    bad |= numeric & one_sign & (fp8_sign(actual) != fp8_sign(ref))
    outcome.fp8_codes += actual.numel()
    if numeric.any():
        outcome.worst_fp8_code_diff = max(outcome.worst_fp8_code_diff, int(diff[numeric].max()))
    if bad.any():
        worst = int(torch.where(bad, diff + 1000 * (ref_nan != actual_nan), -1).argmax())
        exact_allowed = bool(o_low[worst] == o_high[worst])
        got, expected = int(actual[worst]), int(ref[worst])
        _fail(outcome, f"fp8 codes wrong ({region.label}, {fmt})", buffers[region.buffer], int(region.index[worst]),
              int(bad.sum()), bad.numel(),
              f"impl {fp8_text(got, fmt)}, reference {fp8_text(expected, fmt)}; "
              + ("this code must be exact" if exact_allowed else
                 f"allowed {fp8_text(int(low[worst]), fmt)} .. {fp8_text(int(high[worst]), fmt)}"),
              ref_fp8.decode(actual[worst:worst + 1], fmt).item(), ref_fp8.decode(ref[worst:worst + 1], fmt).item(),
              (got, expected))


def check_stored(buffers, after, stored: StoredCopy, outcome: Outcome) -> None:
    cache = memory.bits(after[stored.cache_buffer])[stored.cache_index]
    source = after[stored.source_buffer][stored.source_index]
    if stored.fmt is None:
        bad = cache != memory.bits(source)
        expected = memory.bits(source)
    else:
        expected = ref_fp8.quantize(source, stored.scale.cpu(), stored.fmt)
        cache = cache.to(torch.uint8)
        both_nan = fp8_is_nan(cache, stored.fmt) & fp8_is_nan(expected, stored.fmt)
        bad = (cache != expected) & ~both_nan
    if bad.any():
        worst = int(bad.to(torch.int8).argmax())
        description = f"cache does not hold the value written back ({stored.label})"
        where = (buffers[stored.cache_buffer], int(stored.cache_index[worst]), int(bad.sum()), bad.numel())
        if stored.fmt is None:
            _fail(outcome, description, *where,
                  f"cache bits 0x{int(cache[worst]) & 0xFFFFFFFF:x}, written-back value {float(source[worst]):.9g} "
                  f"-> expected bits 0x{int(expected[worst]) & 0xFFFFFFFF:x}",
                  after[stored.cache_buffer][stored.cache_index[worst]], source[worst])
        else:
            got, want = int(cache[worst]), int(expected[worst])
            _fail(outcome, description, *where,
                  f"cache {fp8_text(got, stored.fmt)}, written-back value {float(source[worst]):.9g} "
                  f"-> expected {fp8_text(want, stored.fmt)}",
                  ref_fp8.decode(cache[worst:worst + 1], stored.fmt).item(),
                  ref_fp8.decode(expected[worst:worst + 1], stored.fmt).item(), (got, want))


def compare(buffers: dict[str, memory.Buffer], after: dict[str, torch.Tensor], expectation: Expectation) -> Outcome:
    """Run every check; raise one AssertionError listing each failed check's worst element."""
    after = {name: flat.cpu() for name, flat in after.items()}
    outcome = Outcome()
    check_bitwise(buffers, after, expectation, outcome)
    for region in expectation.rope:
        check_rope(buffers, after, region, outcome)
    for region in expectation.fp8:
        check_fp8(buffers, after, region, outcome)
    for stored in expectation.stored:
        check_stored(buffers, after, stored, outcome)
    return outcome


def raise_failures(outcome: Outcome) -> Outcome:
    if outcome.failures:
        error = AssertionError("\n".join(["implementation differs from the reference (CONTRACT §5):",
                                          *("  - " + failure for failure in outcome.failures)]))
        error.mla_fuse_record = {"worst": outcome.worst}  # into the failure file (recording.failure_record)
        raise error
    return outcome


def assert_matches(buffers, after, expectation: Expectation) -> Outcome:
    return raise_failures(compare(buffers, after, expectation))


def assert_buffers_equal(buffers, actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                         what: str) -> None:
    """Bitwise equality of whole buffers (fused vs unfused chain; memory untouched by a rejected call)."""
    failures = []
    for name, expected_flat in expected.items():
        differs = memory.bits(actual[name].cpu()) != memory.bits(expected_flat.cpu())
        if differs.any():
            first = int(differs.nonzero()[0])
            failures.append(_worst(f"buffer '{name}'", buffers[name], first, int(differs.sum()), differs.numel(),
                                   f"expected {float(expected_flat[first]):.9g}, got {float(actual[name][first]):.9g}"))
    if failures:
        raise AssertionError("\n".join([what + ":", *("  - " + f for f in failures)]))
