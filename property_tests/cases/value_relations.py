"""Value relations of a built case: what the values an operation writes are, against their formats.

``fields.relations`` names strides, sizes and lengths; a defect that needs a value (a negative one
beyond e4m3fnuz's 240, a NaN, a subnormal) needs relations on the data. These are computed on the
values the operation *writes*, nothing else (a padded row's values are never read):

* a cache write (``MlaCase``, ``FlashCase``): the rows of ``kv_c`` and ``k_pe`` (``key`` and
  ``value``) whose slot is written (``slot >= 0``, among the first ``min(len(slot_mapping),
  tokens)``), as given (a fused operation rotates ``k_pe`` / ``key`` first: its bands are of the
  input, not of the rotated value);
* a rotation (``RopeCase``): every element of ``query`` and ``key``.

Each relation is ``yes`` where some written value has the property (so ``no`` where nothing is
written):

* of the input's own dtype: ``NaN``, ``inf``, ``zero`` (either sign), ``subnormal`` (below its
  dtype's smallest normal), ``negative``, ``positive``;
* for an fp8 cache, of ``x / scale`` (divided in float32, CONTRACT §3) rounded to nearest even on
  the cache format's grid with no range limit, per sign: ``rounding past the format's max`` (what
  saturation clamps: a NaN or inf there is the overflow defect), and ``rounding beyond`` each
  other fp8 format's max below its own (``FORMAT_MAXES``: 240, e4m3fnuz's; 448, e4m3fn's): a
  kernel clamping to, or encoding for, the wrong format fails exactly there (the clamp to
  ``[-240, 448]``: ``a written x/scale rounding below -240 (e4m3fnuz's max): yes``). Then
  ``rounding to fp8 zero`` (a nonzero x that underflows) and ``in the fp8 subnormal range``;
* for an fp8 cache, where the cached code depends on how exactly ``x / scale`` is computed and rounded:
  ``inexact in float32, within 2 ulps of an fp8 tie`` (the float32 quotient that near a midpoint of
  two adjacent values of the cache format, and not exactly ``x / scale``, its product with the scale
  differing from ``x`` in float64: a quotient computed otherwise than by one correctly rounded division,
  a reciprocal multiply ``x * (1 / scale)`` or an approximate division, off by up to two ulps where it
  is inexact, and exact where it is exact (a power-of-two scale), can round to the other code there
  and only there), and, of a rotated key (the key of a fused operation:
  ``key``, or MLA's ``k_pe``, rotated in float64 by the reference), ``a rotated key's fp8 code differs
  between its written-back value and its float32 rotation`` (CONTRACT §2 caches the written-back,
  rounded key: a kernel quantizing its float32 rotation instead caches the other code exactly there).
  The built case is the same for a fused operation and its unfused write, so that relation is
  computed for every case with a table and named only in a rotating property's cells
  (``ROTATION_RELATIONS``; ``commands/conformance_map/diagnosis.py``). Both are listed before the wider
  bands (past a format's max, rounding to zero, the subnormal range): of two relations explaining a
  failure as well, the map names the first listed (a reciprocal scale's failures at subnormal ties, or
  among values beyond -240, are named by the tie).

Bands are named by a format's range, not by a number a defect happened to show, so the same
relation names the same thing in every case, and a value-conditioned defect gets a
value-conditioned cell.
"""

from __future__ import annotations

import torch

from mla_fuse_conformance.cases.types import FlashCase, MlaCase, RopeCase
from mla_fuse_conformance.declarations.dtypes import FP8_FORMAT_OF_KV_CACHE_DTYPE
# ref_*: the reference's modules, apart from the product's and the suite's values of those names
from mla_fuse_reference import fp8 as ref_fp8
from mla_fuse_reference import rope as ref_rope
from mla_fuse_reference.rounding import power_of_two, round_once, round_to_grid

# the finite max of each fp8 format an implementation may confuse a cache's format with (e4m3fnuz:
# AMD's e4m3, no negative zero, max 240; e4m3fn: OCP e4m3, max 448; e5m2: 57344)
FORMAT_MAXES = ((240.0, "e4m3fnuz"), (448.0, "e4m3fn"), (57344.0, "e5m2"))
SIGNS = (("below", -1.0), ("above", 1.0))
TIE_ULPS = 2  # a float32 x / scale computed another way: a reciprocal multiply (<= 1.5 ulps), CUDA's div.full.f32 (2)
NEAR_TIE = f"a written x/scale inexact in float32, within {TIE_ULPS} ulps of an fp8 tie"
ROTATED_KEY_CODE = "a rotated key's fp8 code differs between its written-back value and its float32 rotation"
ROTATION_RELATIONS = (ROTATED_KEY_CODE,)  # of what a fused operation caches; meaningless for an unfused write


def without_rotation(relations: dict | None, rotates: bool) -> dict | None:
    """``relations`` as a property's map may name them: without ``ROTATION_RELATIONS`` where its
    operation does not rotate."""
    if relations is None or rotates:
        return relations
    return {name: value for name, value in relations.items() if name not in ROTATION_RELATIONS}


def written_values(built) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``[(values, scale)]``: each written input's written values, as stored (its dtype), with the
    fp32 scale that broadcasts against them (None where the cache is not fp8 or there is none)."""
    case, args = built.case, built.args
    if isinstance(case, RopeCase):
        return [(args[name], None) for name in ("query", "key") if args.get(name) is not None]
    if not isinstance(case, (MlaCase, FlashCase)):
        return []
    rows = _written_rows(built)
    fp8 = case.kv_cache_dtype in FP8_FORMAT_OF_KV_CACHE_DTYPE
    if isinstance(case, MlaCase):
        scale = args["scale"].to("cpu") if fp8 else None
        return [(args[name].to("cpu")[rows], scale) for name in ("kv_c", "k_pe")]
    out = []
    for name, scale_name in (("key", "k_scale"), ("value", "v_scale")):
        scale = args[scale_name].to("cpu").reshape(1, -1, 1) if fp8 else None
        out.append((args[name].to("cpu")[rows], scale))
    return out


def _written_rows(built) -> torch.Tensor:
    """The token rows a cache write stores: among the first ``min(len(slot_mapping), tokens)``, slot >= 0."""
    slots = built.args["slot_mapping"].to("cpu", torch.int64)
    rows = torch.arange(min(slots.numel(), built.case.tokens))
    return rows[slots[: rows.numel()] >= 0]


def _any(flags: list[torch.Tensor]) -> bool:
    return any(bool(flag.any()) for flag in flags if flag.numel())


def value_relations(built) -> dict[str, bool]:
    """The relations of the module docstring for a built case (``cases.tensors.Built``)."""
    written = written_values(built)
    if not written:
        return {}
    out: dict[str, bool] = {}
    inputs = [values for values, _ in written]
    out["a written value NaN"] = _any([values.isnan() for values in inputs])
    out["a written value inf"] = _any([values.isinf() for values in inputs])
    out["a written value zero"] = _any([values == 0 for values in inputs])
    out["a written value subnormal (of its dtype)"] = _any(
        [(values != 0) & (values.abs() < torch.finfo(values.dtype).tiny) for values in inputs])
    out["a written value negative"] = _any([values < 0 for values in inputs])
    out["a written value positive"] = _any([values > 0 for values in inputs])
    fmt = FP8_FORMAT_OF_KV_CACHE_DTYPE.get(getattr(built.case, "kv_cache_dtype", "auto"))
    if fmt is None or written[0][1] is None:
        return out
    f = ref_fp8.FORMATS[fmt]
    quotients = [(values.float() / scale.float()).double() for values, scale in written]
    rounded = [torch.copysign(round_to_grid(q.abs(), f.mantissa_bits, f.min_exponent), q) for q in quotients]
    # the narrow bands first: of relations explaining a failure as well, the map names the first listed
    out[NEAR_TIE] = _any([_near_tie(q, f) & (q * scale.double() != values.double())
                          for q, (values, scale) in zip(quotients, written)])
    codes_differ = _rotated_key_codes_differ(built, fmt)
    if codes_differ is not None:
        out[ROTATED_KEY_CODE] = codes_differ
    for word, sign in SIGNS:
        out[f"a written x/scale rounding past the format's max, {'negative' if sign < 0 else 'positive'} "
            "(saturates)"] = _any(
            [r * sign > f.max_finite for r in rounded])
        for limit, name in FORMAT_MAXES:
            if limit < f.max_finite:
                out[f"a written x/scale rounding {word} {sign * limit:+g} ({name}'s max)"] = _any(
                    [r * sign > limit for r in rounded])
    out["a written x/scale rounding to fp8 zero (x nonzero)"] = _any(
        [(r == 0) & (q != 0) for q, r in zip(quotients, rounded)])
    out["a written x/scale in the fp8 subnormal range"] = _any(
        [(r != 0) & (r.abs() < 2.0 ** f.min_exponent) for r in rounded])
    return out


def _near_tie(quotient: torch.Tensor, f) -> torch.Tensor:
    """Where the float32 ``quotient`` (held in float64) lies within ``TIE_ULPS`` float32 ulps of the
    midpoint of two adjacent finite values of the fp8 format ``f``."""
    magnitude = quotient.abs()
    inside = torch.isfinite(magnitude) & (magnitude > 0) & (magnitude <= f.max_finite)
    magnitude = torch.where(inside, magnitude, torch.ones_like(magnitude))
    exponent = torch.frexp(magnitude).exponent - 1  # magnitude = m * 2^exponent, 1 <= m < 2
    step = power_of_two(torch.clamp(exponent, min=f.min_exponent) - f.mantissa_bits)  # the fp8 spacing there
    ulp = power_of_two(exponent - 23)  # float32's spacing (the quotient is a normal float32 here)
    fraction = magnitude / step - torch.floor(magnitude / step)  # exact: step is a power of two
    return inside & ((fraction - 0.5).abs() * step <= TIE_ULPS * ulp)


def _rotated_key_codes_differ(built, fmt: str) -> bool | None:
    """Whether some written key's fp8 code differs between its rotation rounded to its dtype (the
    written-back key) and its rotation rounded to float32; None where the case has no table."""
    case, args = built.case, built.args
    table, positions = args.get("cos_sin_cache"), args.get("positions")
    if table is None or positions is None:
        return None
    name, scale = ("k_pe", args["scale"]) if isinstance(case, MlaCase) else ("key", args["k_scale"])
    rows = _written_rows(built)
    key = args[name].to("cpu")[rows]
    key = key[:, None, :] if key.dim() == 2 else key  # MLA's k_pe: one head
    table = table.to("cpu")
    exact = ref_rope.rope_exact(positions.to("cpu")[rows], key[..., : table.size(1)], table, case.is_neox)
    scale = scale.to("cpu").reshape(1, -1, 1)
    written_back = ref_fp8.quantize(round_once(exact, key.dtype), scale, fmt)
    single = ref_fp8.quantize(round_once(exact, torch.float32), scale, fmt)
    return bool((written_back != single).any())
