"""Hypothesis profiles of the property suite (selected with ``--hypothesis-profile NAME``).

``dev``      the local default: random, 30 examples per property, failures kept in the
             example database and replayed first on the next run.
``ci``       the default under ``CI=true``: derandomized (the same examples every run, so a
             red CI run reproduces locally), bounded, no database.
``gpu``      random, more and larger cases (``strategies.LARGE``), for a machine with a GPU.
``nightly``  random, many examples, database kept (export it to share found failures).

``deadline=None`` everywhere: the Triton interpreter's first launch of a kernel compiles
it. The example database is a directory: ``$MLA_FUSE_HYPOTHESIS_DB`` or
``.hypothesis/mla_fuse`` at the repository root.
"""

from __future__ import annotations

import os
import pathlib

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

DATABASE_ENV_VAR = "MLA_FUSE_HYPOTHESIS_DB"
ROOT = pathlib.Path(__file__).resolve().parents[1]
CI_MAX_EXAMPLES = 50
NO_SHRINK_PHASES = (Phase.explicit, Phase.generate)
CI_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink)


def database_path() -> pathlib.Path:
    return pathlib.Path(os.environ.get(DATABASE_ENV_VAR) or ROOT / ".hypothesis" / "mla_fuse")


def _common() -> dict:
    return dict(deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def register() -> None:
    database = DirectoryBasedExampleDatabase(str(database_path()))
    settings.register_profile("dev", max_examples=30, database=database, **_common())
    # no target phase in ci: with few examples, hill-climbing on target() scores would spend
    # them all on mutations of one case; the scores are still recorded and reported
    settings.register_profile("ci", max_examples=CI_MAX_EXAMPLES, derandomize=True, database=None,
                              phases=CI_PHASES, **_common())
    settings.register_profile("gpu", max_examples=200, database=database, **_common())
    settings.register_profile("nightly", max_examples=2000, database=database, **_common())


def default_profile() -> str:
    """``ci`` under ``CI=true`` (as CI services set it), else ``dev``."""
    return "ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev"


def ci_settings(**overrides) -> settings:
    """The ci profile, for callers outside pytest's profile selection (the mutant self-test)."""
    return settings(settings.get_profile("ci"), **overrides)


register()
