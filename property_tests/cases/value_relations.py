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
  ``rounding to fp8 zero`` (a nonzero x that underflows) and ``in the fp8 subnormal range``.

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
from mla_fuse_reference.rounding import round_to_grid

# the finite max of each fp8 format an implementation may confuse a cache's format with (e4m3fnuz:
# AMD's e4m3, no negative zero, max 240; e4m3fn: OCP e4m3, max 448; e5m2: 57344)
FORMAT_MAXES = ((240.0, "e4m3fnuz"), (448.0, "e4m3fn"), (57344.0, "e5m2"))
SIGNS = (("below", -1.0), ("above", 1.0))


def written_values(built) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``[(values, scale)]``: each written input's written values, as stored (its dtype), with the
    fp32 scale that broadcasts against them (None where the cache is not fp8 or there is none)."""
    case, args = built.case, built.args
    if isinstance(case, RopeCase):
        return [(args[name], None) for name in ("query", "key") if args.get(name) is not None]
    if not isinstance(case, (MlaCase, FlashCase)):
        return []
    slots = args["slot_mapping"].to("cpu", torch.int64)
    rows = torch.arange(min(slots.numel(), case.tokens))
    rows = rows[slots[: rows.numel()] >= 0]
    fp8 = case.kv_cache_dtype in FP8_FORMAT_OF_KV_CACHE_DTYPE
    if isinstance(case, MlaCase):
        scale = args["scale"].to("cpu") if fp8 else None
        return [(args[name].to("cpu")[rows], scale) for name in ("kv_c", "k_pe")]
    out = []
    for name, scale_name in (("key", "k_scale"), ("value", "v_scale")):
        scale = args[scale_name].to("cpu").reshape(1, -1, 1) if fp8 else None
        out.append((args[name].to("cpu")[rows], scale))
    return out


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
