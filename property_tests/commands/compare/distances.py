"""How far apart two passing implementations are on one case (``mla-fuse compare``).

Each side is what ``running/outputs.py`` brought back from its child: the memory after the
operation and where CONTRACT §5 compares with a tolerance. Both passed, so both are within §5 of
the reference; the distance says how they differ from each other:

* ``max_ulps``: the largest ``|a - b| / ulp(max(|a|, |b|))`` over the elements both rotate, in
  the spacing of the rotated tensor's dtype (equal values, NaN and NaN, are 0);
* ``max_fp8_codes``: the largest difference of fp8 codes as ordered integers (adjacent values
  1 apart, +0 = -0) over the codes both write, NaN where both hold NaN excluded;
* ``passthrough_bytes`` / ``cache_bytes``: bytes that differ anywhere else, in the inputs'
  buffers (pass-through columns, unrotated rows, the sentinels around every view) and in the
  caches' (entries not written by either, the sentinels around them). An element one side
  rotates and the other leaves alone (two ``padded_rows`` declarations) counts here, as does
  one that is NaN on one side only.
"""

from __future__ import annotations

import dataclasses

import torch

from mla_fuse_conformance.judging.comparisons import fp8_is_nan, fp8_ordinal, ulp
from mla_fuse_conformance.running.outputs import unpack


@dataclasses.dataclass
class Distance:
    """The largest distances over the cases two implementations both passed (comparison.json's
    ``differences`` entry, less ``a`` and ``b``)."""

    cases: int = 0
    max_ulps: float = 0.0
    max_fp8_codes: int = 0
    passthrough_bytes: int = 0
    cache_bytes: int = 0

    def add(self, a: dict, b: dict) -> None:
        """Fold in one case both passed (``a``, ``b``: ``Executor.outputs`` of each)."""
        after_a, after_b = unpack(a), unpack(b)
        covered = {name: torch.zeros(flat.numel(), dtype=torch.bool) for name, flat in after_a.items()}
        self.cases += 1
        for buffer, index, dtype in _shared(a["rotated"], b["rotated"], after_a):
            self._rotated(after_a[buffer][index], after_b[buffer][index], dtype, covered[buffer], index)
        for buffer, index, fmt in _shared(a["fp8"], b["fp8"], after_a):
            self._fp8(after_a[buffer].view(torch.uint8)[index], after_b[buffer].view(torch.uint8)[index], fmt,
                      covered[buffer], index)
        for name, flat in after_a.items():
            differs = flat.view(torch.uint8) != after_b[name].view(torch.uint8)
            differing = int((differs & ~covered[name].repeat_interleave(flat.element_size())).sum())
            if name in a["caches"]:
                self.cache_bytes += differing
            else:
                self.passthrough_bytes += differing

    def _rotated(self, x: torch.Tensor, y: torch.Tensor, dtype: str, covered: torch.Tensor, index) -> None:
        """Rotated values: ulps apart where both are numbers or both the same (NaN and NaN included)."""
        x, y = x.to(torch.float64), y.to(torch.float64)
        same = (x == y) | (torch.isnan(x) & torch.isnan(y))
        measured = same | (torch.isfinite(x) & torch.isfinite(y))
        spacing = ulp(torch.maximum(x.abs(), y.abs()), getattr(torch, dtype))
        ulps = torch.where(same, 0.0, (x - y).abs() / spacing)[measured]
        if ulps.numel():
            self.max_ulps = max(self.max_ulps, float(ulps.max()))
        covered[index[measured]] = True

    def _fp8(self, x: torch.Tensor, y: torch.Tensor, fmt: str, covered: torch.Tensor, index) -> None:
        """fp8 codes: ordinals apart where neither is NaN; NaN and NaN is no difference."""
        nan_x, nan_y = fp8_is_nan(x, fmt), fp8_is_nan(y, fmt)
        numeric = ~nan_x & ~nan_y
        codes = (fp8_ordinal(x) - fp8_ordinal(y)).abs()[numeric]
        if codes.numel():
            self.max_fp8_codes = max(self.max_fp8_codes, int(codes.max()))
        covered[index[numeric | (nan_x & nan_y)]] = True

    def record(self) -> dict:
        return dataclasses.asdict(self)


def _shared(regions_a: list, regions_b: list, after: dict[str, torch.Tensor]):
    """``(buffer, element index, label)`` of each of ``regions_a``'s elements that ``regions_b``
    covers too (the implementations' ``padded_rows`` may differ)."""
    masks = {}
    for buffer, index, _ in regions_b:
        masks.setdefault(buffer, torch.zeros(after[buffer].numel(), dtype=torch.bool))[torch.as_tensor(index)] = True
    for buffer, index, label in regions_a:
        index = torch.as_tensor(index)
        if buffer in masks:
            yield buffer, index[masks[buffer][index]], label
