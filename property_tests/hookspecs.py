"""Hooks the suite's pytest plugin calls, for a conftest.py of the user's project to implement.

``pytest_mla_fuse_deployments(config)`` returns the user's own deployments
(``mla_fuse_conformance.declarations.deployments.Deployment``), run by the deployment properties
beside the suite's and an adapter's ``deployments`` attribute: a team keeps its deployments in
its test tree, next to the adapter, without editing the adapter. Example::

    # conftest.py, in the directory pytest runs from
    import dataclasses
    from mla_fuse_conformance.declarations.deployments import DEPLOYMENTS, Deployment

    def pytest_mla_fuse_deployments(config):
        return [dataclasses.replace(DEPLOYMENTS[0], name="our-deepseek-v3-tp1-decode", tokens=6)]

Every implementation's results are checked as an adapter's are (``problems_of``, unique names).
"""

from __future__ import annotations


def pytest_mla_fuse_deployments(config):
    """Return an iterable of ``Deployment`` to run beside the suite's (none: return ``()``)."""
