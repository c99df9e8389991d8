"""The names a user types to choose what the suite runs against, declared once.

The pytest plugin imports this module when pytest loads it into any session, so it stays a leaf
of plain strings: it imports nothing (no torch, hypothesis or Triton). Error messages name the
option as the user gave it (``contract.implementation.load_implementation(..., option=...)``).
"""

from __future__ import annotations

import os

# pytest --pyargs mla_fuse_conformance --mla-fuse-impl=SPEC --mla-fuse-require=OP[,OP]
PYTEST_IMPL_OPTION = "--mla-fuse-impl"
PYTEST_REQUIRE_OPTION = "--mla-fuse-require"
# --mla-fuse-shrink-seconds=S: hypothesis stops shrinking a failing property after S seconds
PYTEST_SHRINK_OPTION = "--mla-fuse-shrink-seconds"
# mla-fuse verify --impl SPEC --require OP[,OP] (and the other commands' --impl)
CLI_IMPL_OPTION = "--impl"
CLI_REQUIRE_OPTION = "--require"
# The implementation when no option names one (read by contract.implementation.resolve_spec).
IMPL_ENV_VAR = "MLA_FUSE_IMPL"
DEFAULT_IMPL = "triton"
# Triton's switch to its interpreter, and the mark mla-fuse leaves beside it where it set the switch itself
# (no GPU, none of the user's: running.devices.interpret_triton_without_a_gpu): processes started from a
# run inherit both, so only a setting without the mark is the user's, which a printed replay line carries.
TRITON_INTERPRET_ENV_VAR = "TRITON_INTERPRET"
SET_BY_MLA_FUSE_ENV_VAR = "MLA_FUSE_SET_TRITON_INTERPRET"


def users_triton_interpret(environ) -> str | None:
    """The user's own ``TRITON_INTERPRET`` in ``environ`` (None: unset, or the value mla-fuse set, marked)."""
    value = environ.get(TRITON_INTERPRET_ENV_VAR)
    return None if value is None or environ.get(SET_BY_MLA_FUSE_ENV_VAR) == value else value


# Where an adapter of another project finds that project's kernel files (``MLA_FUSE_SGLANG_PATH``,
# ``MLA_FUSE_FLAGGEMS_PATH``, ...: ``MLA_FUSE_<PROJECT>_PATH``): the kernel files are the implementation a
# failure ran, so a printed replay line sets them as the run had them.
KERNEL_PATH_PREFIX, KERNEL_PATH_SUFFIX = "MLA_FUSE_", "_PATH"


def kernel_paths(environ) -> dict[str, str]:
    """The variables of ``environ`` naming where an adapter finds another project's kernel files."""
    return {name: value for name, value in sorted(environ.items())
            if name.startswith(KERNEL_PATH_PREFIX) and name.endswith(KERNEL_PATH_SUFFIX) and value}


def replay_environment(environ) -> dict[str, str]:
    """What a printed replay line sets before it runs: where the run's adapter found another project's
    kernel files (``kernel_paths``, absolute: a new shell has none of them, and the adapter would look for
    an installed package), and the user's own ``TRITON_INTERPRET`` (one mla-fuse set, a replay sets again)."""
    environment = {name: os.path.abspath(value) for name, value in kernel_paths(environ).items()}
    users = users_triton_interpret(environ)
    if users is not None:
        environment[TRITON_INTERPRET_ENV_VAR] = users
    return environment
