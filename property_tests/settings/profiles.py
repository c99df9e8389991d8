"""Hypothesis profiles of the conformance suite, registered under the ``mla_fuse.`` prefix.

``mla_fuse.dev``      the local default: random, 30 examples per property, failures kept in the
                      example database and replayed first on the next run.
``mla_fuse.ci``       the default under ``CI=true``: derandomized (the same examples every run, so a
                      red CI run reproduces locally), bounded, no database.
``mla_fuse.gpu``      random, more and larger cases (``cases.sizes.LARGE``), for a machine with a GPU.
``mla_fuse.nightly``  random, many examples, database kept (export it to share found failures);
                      what ``mla-fuse fuzz`` runs HypoFuzz under.
``mla_fuse.replay``   only the examples stored in the database (phase ``reuse``): nothing is
                      generated, so a failure it shows came from the database.

The prefix keeps them apart from a project's own ``dev``/``ci`` profiles: the suite is a
pytest plugin installed next to the user's tests. ``--hypothesis-profile mla_fuse.ci``
selects one; ``mla-fuse verify --profile ci`` takes the short name. When none is named and
the suite is in use (``plugin.py``), ``mla_fuse.ci`` is loaded under ``CI=true``, else ``mla_fuse.dev``.

``deadline=None`` everywhere: the Triton interpreter's first launch of a kernel compiles
it. The example database (every profile but ``ci``) is ``$MLA_FUSE_HYPOTHESIS_DB``: a directory
or ``redis://host:port/db``, else ``.hypothesis/mla_fuse`` under the current directory;
``$MLA_FUSE_HYPOTHESIS_DB_READ_ONLY=1`` only reads it (``mla_fuse_conformance.settings.database``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.internal.conjecture import engine

from mla_fuse_conformance.settings import database as example_database  # `database`: a local below

PREFIX = "mla_fuse."
NAMES = ("dev", "ci", "gpu", "nightly", "replay")
CI_MAX_EXAMPLES = 50
NO_SHRINK_PHASES = (Phase.explicit, Phase.generate)
CI_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)
REPLAY_PHASES = (Phase.reuse,)
# the profiles that skip the cases past 2^31 elements (properties/test_large_addresses.py: up to 8.9 GB filled and
# checked), and the reason the test and ``verify``'s "not run" line give
LARGE_ADDRESSES_SKIPPED_IN = ("dev",)
LARGE_ADDRESSES_NOT_RUN = ("cases past 2^31 elements (up to 8.9 GB) are not run in the dev profile; the ci, gpu and "
                           "nightly profiles run them")


def _common() -> dict:
    # parent: hypothesis' own defaults. Without it a profile inherits the one loaded when it is
    # registered, and under CI=true hypothesis loads its `ci` profile at import (derandomize=True).
    return dict(parent=settings.get_profile("default"), deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def full_name(short: str) -> str:
    """``ci`` -> ``mla_fuse.ci``; a name that already has the prefix (or is someone else's) is kept."""
    return PREFIX + short if short in NAMES else short


def current() -> str | None:
    """The short name of the loaded profile if it is one of ours, else None."""
    name = settings.get_current_profile_name()
    return name[len(PREFIX):] if name.startswith(PREFIX) else None


def register() -> None:
    database = example_database.from_environment()
    settings.register_profile(PREFIX + "dev", max_examples=30, database=database, **_common())
    # no target phase in ci: with few examples, hill-climbing on target() scores would spend
    # them all on mutations of one case; the scores are still recorded and reported
    settings.register_profile(PREFIX + "ci", max_examples=CI_MAX_EXAMPLES, derandomize=True, database=None,
                              phases=CI_PHASES, **_common())
    settings.register_profile(PREFIX + "gpu", max_examples=200, database=database, **_common())
    settings.register_profile(PREFIX + "nightly", max_examples=2000, database=database, **_common())
    settings.register_profile(PREFIX + "replay", database=database, phases=REPLAY_PHASES, **_common())


# What hypothesis reports when it stops shrinking at its time limit (``engine.MAX_SHRINKING_SECONDS``)
SLOW_SHRINK_STOP = "stopped because it is making very slow progress"


def bound_shrinking(seconds: float) -> None:
    """Stop shrinking a failing test after ``seconds`` (in this process, for every test it runs after).
    Hypothesis has no setting for it: this sets the module constant of its own stop for slow shrinking
    (300 s; hypothesis 6.x's ``internal.conjecture.engine.MAX_SHRINKING_SECONDS``, read each time a
    test starts shrinking), which then reports ``SLOW_SHRINK_STOP``. The case hypothesis prints is the
    smallest failing case found by then; its replay reruns it."""
    if seconds <= 0:
        raise ValueError(f"--mla-fuse-shrink-seconds must be > 0, got {seconds:g}")
    engine.MAX_SHRINKING_SECONDS = seconds


def shrink_seconds() -> float:
    return engine.MAX_SHRINKING_SECONDS


def default_profile() -> str:
    """``ci`` under ``CI=true`` (as CI services set it), else ``dev``."""
    return "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"


def select_default(explicit: bool) -> None:
    """Load the default profile unless one of ours is loaded or ``--hypothesis-profile`` chose
    another (``explicit``; hypothesis itself loads its own ``ci`` profile at import under
    ``CI=true``: that is not a choice). The plugin calls this when the suite is in use."""
    if not explicit and current() is None:
        settings.load_profile(full_name(default_profile()))


def ci_settings(**overrides) -> settings:
    """The ci profile, for callers outside pytest's profile selection (the mutant self-test)."""
    return settings(settings.get_profile(PREFIX + "ci"), **overrides)


register()
