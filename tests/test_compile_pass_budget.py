"""The compile-pass property's example count per profile: the ci and gpu profiles' own budgets
(``test_compile_passes.EXAMPLES``: an example is host work a GPU does not speed up, so the gpu
profile's 200 would hold one worker past the profile's time target), the others the profile's
count. Read in a child process: the count is fixed when the module is imported under a profile."""

from __future__ import annotations

import json
import subprocess
import sys

from mla_fuse_conformance.properties.test_compile_passes import CI_EXAMPLES, GPU_EXAMPLES

READS_THE_COUNTS = """
import importlib, json

from hypothesis import settings

from mla_fuse_conformance.settings import profiles

profiles.register()
import mla_fuse_conformance.properties.test_compile_passes as module

counts = {}
for name in profiles.NAMES:
    settings.load_profile(profiles.full_name(name))
    module = importlib.reload(module)
    test = module.test_passes_fuse_exactly_where_allowed_bitwise_and_copy_free
    counts[name] = test._hypothesis_internal_use_settings.max_examples
print(json.dumps(counts))
"""


def test_the_ci_and_gpu_profiles_budget_the_compile_pass_property():
    done = subprocess.run([sys.executable, "-c", READS_THE_COUNTS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["ci"] == CI_EXAMPLES and counts["gpu"] == GPU_EXAMPLES, counts
    assert counts["dev"] == 30 and counts["nightly"] == 2000, counts  # the profiles' own counts
    assert GPU_EXAMPLES < 200 and CI_EXAMPLES < GPU_EXAMPLES
