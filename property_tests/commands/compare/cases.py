"""The cases ``mla-fuse compare`` runs on every implementation, and the cell each belongs to.

The cases of an operation are drawn from the strategy of its ``*_matches_reference`` property, the
whole contract (no implementation's declared limits: they are not projected on any one), by
hypothesis' generate phase under ``@seed``: the same seed, profile and count give the same cases
on any machine. The profile chooses the sizes (``cases/sizes.limits``: ``gpu`` draws model sizes).

A cell is a few feature axes (``cases/features.py``) that keep the table readable: the activation
dtype, the RoPE style where the operation rotates, the cache dtype where it writes a cache.
"""

from __future__ import annotations

import contextlib

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings

from mla_fuse_conformance.cases.features import describe, features
from mla_fuse_conformance.running.harness import all_properties
from mla_fuse_conformance.settings import profiles

CELL_AXES = ("dtype", "style", "kv_cache_dtype")


def reference_property(operation: str):
    """The property that checks ``operation`` alone against the reference (its strategy, ``rotates``)."""
    return next(prop for prop in all_properties().values()
                if prop.operations == (operation,) and not prop.needs_input_checks)


@contextlib.contextmanager
def profile_loaded(profile: str):
    """Hypothesis' ``profile`` (ours by short name) for the drawing, the caller's again after it."""
    previous = settings.get_current_profile_name()
    settings.load_profile(profiles.full_name(profile))
    try:
        yield
    finally:
        settings.load_profile(previous)


def draw_cases(operation: str, count: int, seed_value: int, profile: str) -> list:
    """``count`` cases of ``operation`` (fewer where hypothesis runs out of distinct ones)."""
    drawn: list = []

    @seed(seed_value)
    @settings(database=None, derandomize=False, max_examples=count, phases=(Phase.generate,), deadline=None,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(case=reference_property(operation).strategies[0])
    def collect(case):
        drawn.append(case)

    with profile_loaded(profile):
        collect()
    return drawn


def cell_of(case, rotates: bool) -> str:
    """``dtype bfloat16, style neox, kv_cache_dtype fp8_e4m3``: ``case``'s values on ``CELL_AXES``."""
    found = features(case, rotates)
    return describe({axis: found[axis] for axis in CELL_AXES if axis in found})
