"""The ``mla_fuse`` fixture is the ``harness.PropertyRun`` of the test that requests it, and works
under a hypothesis profile of the user's own (which does not suppress the
``function_scoped_fixture`` health check: the plugin does, for the tests that take the fixture)."""

from __future__ import annotations

import os
import subprocess
import sys

USER_CONFTEST = """
from hypothesis import settings

settings.register_profile("theirs", max_examples=3, deadline=None, database=None)
"""

USER_PROPERTIES = """
import pytest
from hypothesis import given, settings

from mla_fuse_conformance.cases import strategies


def names_its_test(run, case, name):
    assert run.prop.name == name, run.prop.name


@pytest.mark.mla_fuse("rotary_embedding")
@given(case=strategies.rope_cases())
def test_first(mla_fuse, case):
    mla_fuse.example(case, names_its_test, "test_user_properties:test_first")


@pytest.mark.mla_fuse("concat_and_cache_mla")
@settings(max_examples=2)
@given(case=strategies.mla_cases(fused=False))
def test_second(mla_fuse, case):
    mla_fuse.example(case, names_its_test, "test_user_properties:test_second")
"""


def test_each_test_gets_its_own_property_run_under_the_users_profile(tmp_path):
    (tmp_path / "conftest.py").write_text(USER_CONFTEST)
    (tmp_path / "test_user_properties.py").write_text(USER_PROPERTIES)
    env = {key: value for key, value in os.environ.items() if not key.startswith("MLA_FUSE_")}
    env.update(MLA_FUSE_FAILURE_DIR=str(tmp_path / "failures"), MLA_FUSE_HYPOTHESIS_DB=str(tmp_path / "db"))
    done = subprocess.run([sys.executable, "-m", "pytest", "test_user_properties.py", "-q", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "--mla-fuse-impl=reference", "--hypothesis-profile=theirs"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout, done.stdout[-2000:]


def test_a_falsifying_example_prints_the_fixture_in_one_line():
    """hypothesis prints every argument of a falsifying example; the ``mla_fuse`` fixture's dataclass
    fields hold the property's strategies (hundreds of explicit cases), which filled verify's log."""
    from hypothesis.vendor.pretty import pretty

    from mla_fuse_conformance.running.harness import Property, PropertyRun

    prop = Property("test_mla:test_x", ("concat_and_cache_mla",), (object(),) * 300, lambda: None)
    impl = type("Impl", (), {"name": "vllm-cpu-amx"})()
    assert pretty(PropertyRun(prop, impl, "cpu", None)) == "PropertyRun('test_mla:test_x', impl='vllm-cpu-amx', device='cpu')"
