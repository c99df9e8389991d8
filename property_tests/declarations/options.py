"""The names a user types to choose what the suite runs against, declared once.

The pytest plugin imports this module when pytest loads it into any session, so it stays a leaf
of plain strings: it imports nothing (no torch, hypothesis or Triton). Error messages name the
option as the user gave it (``contract.implementation.load_implementation(..., option=...)``).
"""

from __future__ import annotations

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
