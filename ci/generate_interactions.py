"""Write the suite's covering arrays of interactions (``cases/interaction_rows.py``).

Usage: ``python ci/generate_interactions.py`` from the repository root (after a change to the
feature axes, the size crossings or the presets; ``tests/test_interactions.py`` fails until the
committed rows match). Deterministic: the same code writes the same file.
"""

from __future__ import annotations

import pathlib
import pprint
import sys

from mla_fuse_conformance.cases import interactions
from mla_fuse_conformance.declarations.operations import OPERATIONS

HEADER = '''"""The covering arrays of ``cases/interactions.py``, one per operation: generated data.

Written by ``python ci/generate_interactions.py`` (``interactions.cover_rows``); do not edit by
hand. Each row is ``((parameter, value), ...)``: the ``size`` level, then feature-axis values.
"""

'''


def render(rows: dict[str, list[dict[str, str]]]) -> str:
    """The module text for ``{operation: rows}``."""
    data = {operation: tuple(tuple(row.items()) for row in operation_rows) for operation, operation_rows in rows.items()}
    return HEADER + "ROWS = " + pprint.pformat(data, width=116, sort_dicts=False) + "\n"


def main() -> int:
    rows = {operation: interactions.cover_rows(operation) for operation in OPERATIONS}
    target = pathlib.Path(interactions.__file__).with_name("interaction_rows.py")
    target.write_text(render(rows))
    for operation, operation_rows in rows.items():
        print(f"{operation}: {len(operation_rows)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
