"""Eager float64 reference of the mla_fuse contract (CONTRACT §1-§4).

Readable PyTorch written like the math: it computes in float64 from the given
(already rounded) inputs, rounds once at the end, and mutates nothing (except
``adapter.ReferenceImplementation``, which is the in-place form the suite
drives). It never imports ``mla_fuse``.
"""

from . import cache, fp8, ops, rope, rounding

__all__ = ["cache", "fp8", "ops", "rope", "rounding"]
