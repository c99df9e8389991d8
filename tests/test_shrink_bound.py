"""``mla-fuse verify``'s dev profile bounds hypothesis' shrinking of a failing property
(``--mla-fuse-shrink-seconds``): a compile-pass failure shrank for more than five minutes, most of a
run whose verdict the README promises in about two. The failure then says that shrinking was cut short;
its replay reruns the case found by then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mla_fuse_conformance.commands.verify import run as verify

PROPERTY = "mla_fuse_conformance.properties.test_mla"


def test_verify_bounds_shrinking_in_the_dev_profile_only(tmp_path):
    option = f"--mla-fuse-shrink-seconds={verify.DEV_SHRINK_SECONDS:g}"
    assert option in verify.pytest_command("triton", "dev", tmp_path, "auto", (), [])
    for profile in ("ci", "gpu", "nightly"):
        assert not any(arg.startswith("--mla-fuse-shrink-seconds")
                       for arg in verify.pytest_command("triton", profile, tmp_path, "auto", (), []))


# explicit examples are reported as they are, never shrunk: a profile of drawn examples only, so the
# failure hypothesis reports is one it shrank
GENERATED_ONLY = """from hypothesis import Phase, settings
settings.register_profile("generated_only", max_examples=30, deadline=None, database=None,
                          phases=[Phase.generate, Phase.shrink])
"""


def run_property(tmp_path, *options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MLA_FUSE_REPORT_DIR=str(tmp_path / "reports"))
    env.pop("CI", None)
    (tmp_path / "conftest.py").write_text(GENERATED_ONLY)
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", PROPERTY, "-p", "no:cacheprovider", "-q",
                           "-k", "test_mla_cache_write_matches_reference", "--mla-fuse-impl=mutant:mla_regions_swapped",
                           "--hypothesis-profile=generated_only", "--hypothesis-seed=1", *options],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)


def failure_of(tmp_path) -> dict:
    lines = [json.loads(line) for line in (tmp_path / "reports" / "outcomes.jsonl").read_text().splitlines()]
    [failure] = [line["failure"] for line in lines if line.get("failure")]
    return failure


def test_a_failing_property_stops_shrinking_at_the_bound_and_says_so(tmp_path):
    done = run_property(tmp_path, "--mla-fuse-shrink-seconds=0.001")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    failure = failure_of(tmp_path)
    assert failure["shrinking"].startswith("cut short after 0.001 s"), failure
    assert failure["kind"] == "wrong result"


def test_without_the_option_a_failure_says_nothing_of_shrinking(tmp_path):
    done = run_property(tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "shrinking" not in failure_of(tmp_path)


def test_a_bound_that_is_not_positive_stops_pytest_naming_the_option(tmp_path):
    done = run_property(tmp_path, "--mla-fuse-shrink-seconds=0")
    assert done.returncode == 4 and "--mla-fuse-shrink-seconds must be > 0" in done.stderr, done.stderr[-2000:]
