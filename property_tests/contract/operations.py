"""Moved to ``mla_fuse_conformance.declarations.operations`` (the bottom layer, so ``cases`` can read it).

Kept only while ``running/harness.py`` still imports this path (its owner moves the import); remove then.
"""

from mla_fuse_conformance.declarations.operations import (  # noqa: F401
    CACHING_OPERATIONS, FAMILY_OF_OPERATION, FUSED_OPERATIONS, OPERATION_ARGUMENTS, OPERATIONS, PADDED_ROW_MODES,
    ROTATING_OPERATIONS, ROUNDING_MODES)
