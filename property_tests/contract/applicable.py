"""Which properties apply to an implementation: those that would only skip are deselected.

A property marked ``@pytest.mark.mla_fuse(*operations)`` skips for an implementation that does
not provide one of its operations (and does not require it: then it fails), and a bad-input
property skips for one that declares ``checks_inputs=False`` (``harness.Property.check_provided``).
Deselected at collection instead, they cost nothing: no fixture is set up and hypothesis draws no
case. ``plugin.pytest_collection_modifyitems`` calls ``deselect_inapplicable``.
"""

from __future__ import annotations


def only_skips(mark, impl) -> bool:
    """A property with ``mark`` (its ``mla_fuse`` mark, or None) would only skip for ``impl``."""
    missing = [op for op in (mark.args if mark is not None else ()) if not impl.provides(op)]
    if any(op in impl.required for op in missing):
        return False  # fails: the implementation must provide it
    return bool(missing) or (mark is not None and bool(mark.kwargs.get("bad_input")) and not impl.checks_inputs)


def deselect_inapplicable(config, items: list, impl) -> None:
    """Remove from ``items`` the tests that would only skip for ``impl``, reported as deselected."""
    inapplicable = [item for item in items if only_skips(item.get_closest_marker("mla_fuse"), impl)]
    if inapplicable:
        config.hook.pytest_deselected(items=inapplicable)
        dropped = {id(item) for item in inapplicable}
        items[:] = [item for item in items if id(item) not in dropped]
