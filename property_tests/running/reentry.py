"""Fixtures that can be set up again for a test that already ran in this process (HypoFuzz).

HypoFuzz runs many tests in one process and moves between them: on leaving a test it tears
down every fixture (``SetupState.teardown_exact(None)``, the session's ones included), on
entering one it sets them up again and reads each argument with ``getfixturevalue``. Pytest
caches, in the test item's own ``FixtureRequest``, the ``FixtureDef`` each argument came from;
pytest itself throws that request away after a test's teardown, HypoFuzz 25.11.1 keeps it. So
the second time HypoFuzz enters a test, ``getfixturevalue`` finds the torn-down ``FixtureDef``
and fails ("The fixture value for "mla_fuse_impl" is not available. This can happen when the
fixture has already been torn down."), which killed the fuzzing process of a campaign worker.
Any fixture does this, whatever its scope (function-scoped ones too), so the fix is not in
the fixtures: when a fixture is finalized, it is dropped from the cache of every item that
still holds it, and the next setup computes it afresh. In a plain pytest run the item's
request is gone after its teardown, and this finds nothing to drop.
"""

from __future__ import annotations


def forget_finalized_fixture(fixturedef, request) -> int:
    """Drop ``fixturedef`` from the fixture caches of the session's items (``pytest_fixture_post_finalizer``);
    return how many items held it."""
    dropped = 0
    for item in getattr(request.session, "items", None) or ():
        cached = getattr(getattr(item, "_request", None), "_fixture_defs", None)
        if cached is not None and cached.get(fixturedef.argname) is fixturedef:
            del cached[fixturedef.argname]
            if getattr(item, "funcargs", None) is not None:
                item.funcargs.pop(fixturedef.argname, None)
            dropped += 1
    return dropped
