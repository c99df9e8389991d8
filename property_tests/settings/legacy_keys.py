"""Example-database keys of the suite's properties before they were plain ``@given`` tests.

Hypothesis keys a test's saved examples by a digest of the test function's source
(``function_digest``), plus the suite node id the plugin adds (``database.key_by_suite_node_id``).
In the suite's first layout every kernel property was a body registered with ``harness.prop`` (or
``harness.bad_input_prop``) and ran through one of two wrapper functions, reproduced below with
their exact source, so the keys they produced can be computed again: the plugin
reads a property's examples under its old key too (``VersionStampedDatabase.aliases``), and a
database written before the change still replays after it.
"""

from __future__ import annotations

from hypothesis.internal.reflection import function_digest


def prop():  # the shape of the first layout's harness.prop: hypothesis hashed its nested ``test``
    def decorate(body):
        def test(mla_fuse_impl, mla_fuse_device, case):
            _run_or_skip(registered, mla_fuse_impl, mla_fuse_device, case)  # noqa: F821

        return test

    return decorate(None)


def bad_input_prop():  # the first layout's harness.bad_input_prop
    def decorate(body):
        def test(mla_fuse_impl, mla_fuse_device, corruption, base):
            _run_or_skip(registered, mla_fuse_impl, mla_fuse_device, BadInputCase(operation, corruption, base))  # noqa: F821

        return test

    return decorate(None)


def legacy_key(suite_node_id: str, bad_input: bool) -> bytes:
    """The key hypothesis used in the wrapper layout for the property test ``suite_node_id``."""
    wrapper = bad_input_prop() if bad_input else prop()
    wrapper._hypothesis_internal_add_digest = suite_node_id.encode()
    return function_digest(wrapper)
