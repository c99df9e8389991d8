#!/usr/bin/env bash
# One version leg: a venv of its own (.venv-leg) with the given torch / triton / hypothesis and
# this checkout's `.[test]` (nothing else: what a team's gate installs), then the kernels' unit
# tests and the conformance suite (ci profile) on it. The main test command (.ci/run) runs the
# newest triton and hypothesis; this runs the other ends of the ranges (docs/VERSIONS.md).
#   ci/version_leg.sh oldest   torch 2.13.0 (the CPU build, which requires no triton), triton 3.6.0,
#                              hypothesis 6.139.0: the triton and hypothesis floors of pyproject.toml.
#                              Every change (.ci/run); about 7 minutes on the 2-core development
#                              machine. The compile-pass property is left out: it exercises torch's
#                              Inductor (the same torch as the main leg), not triton, and takes over
#                              ten minutes on a CPU.
#   ci/version_leg.sh newest   torch 2.13.0, triton 3.9.0, the newest hypothesis below 7: the test
#                              command runs hypothesis 6.157.0 (the fuzz extra's ceiling: hypofuzz
#                              25.11), so the test extra's own top is run here. Every change. Only
#                              the unit tests that use hypothesis (failure files, databases): the
#                              kernels', custom ops' and conversions' tests import none of it, and the
#                              test command runs them on this torch and triton.
#   ci/version_leg.sh engine   torch 2.14.1 (the CUDA build PyPI serves: several GB, so nightly),
#                              triton 3.8.0, the newest hypothesis: what vLLM 0.33 and SGLang 0.5.23
#                              install. Adds the compile passes' unit tests and property.
#   ci/version_leg.sh floor-torch  torch 2.11.0 (pyproject's torch floor; the CUDA build, several GB:
#                              nightly) with triton 3.6.0, the pair it requires: the engine leg's
#                              tests but the compile-pass property (see below). Engines pinned to
#                              torch 2.11 install this pair.
#   ci/version_leg.sh newest-torch torch 2.15.0 (the newest release when this was written; nightly)
#                              with triton 3.9.0, the triton it requires: the engine leg's tests.
# Without a GPU the kernels run on Triton's interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
export CI=true

# The kernels, the custom ops, the interpreter's conversions and the launcher's refusals (which read
# Triton's jit options) need only the test extra, and no hypothesis; failure files and databases
# (hypothesis' own formats: files written under the newest hypothesis replay here, tests/data/replay/).
KERNEL_TESTS=(tests/test_kernels.py tests/test_custom_ops.py tests/test_interpreter_conversions.py
              tests/test_launcher.py)
HYPOTHESIS_TESTS=(tests/test_replay_files.py tests/test_database_versions.py)
# The compile passes' unit tests (the legs that change torch run them; the others keep the torch of
# the test command).
PASS_TESTS=(tests/test_passes_unit.py tests/test_passes_mla.py tests/test_passes_mha.py
            tests/test_pass_regressions.py tests/test_pass_engine_caches.py tests/test_torch_versions.py)

case "${1:-}" in
    oldest)
        pins=(torch==2.13.0 triton==3.6.0 hypothesis==6.139.0)
        unit_tests=("${KERNEL_TESTS[@]}" "${HYPOTHESIS_TESTS[@]}")
        suite_selection=(-k "not test_compile_passes") ;;
    newest)
        pins=(torch==2.13.0 triton==3.9.0 "hypothesis<7")
        unit_tests=("${HYPOTHESIS_TESTS[@]}")
        suite_selection=(-k "not test_compile_passes") ;;
    engine)
        pins=(torch==2.14.1 triton==3.8.0)
        unit_tests=("${KERNEL_TESTS[@]}" "${HYPOTHESIS_TESTS[@]}" "${PASS_TESTS[@]}")
        suite_selection=() ;;
    floor-torch)
        pins=(torch==2.11.0 triton==3.6.0)
        unit_tests=("${KERNEL_TESTS[@]}" "${HYPOTHESIS_TESTS[@]}" "${PASS_TESTS[@]}")
        # Inductor 2.11 itself, no pass running (level 0 too), gives other bits than eager for
        # models that round to bf16 and widen again (docs/PASSES.md, "torch versions"): the unit
        # tests that meet it are xfail(strict) on torch < 2.13; the property draws such models at
        # random, so it is left out here.
        suite_selection=(-k "not test_compile_passes") ;;
    newest-torch)
        pins=(torch==2.15.0 triton==3.9.0)
        unit_tests=("${KERNEL_TESTS[@]}" "${HYPOTHESIS_TESTS[@]}" "${PASS_TESTS[@]}")
        suite_selection=() ;;
    *)
        echo "usage: ci/version_leg.sh oldest|newest|engine|floor-torch|newest-torch" >&2
        exit 2 ;;
esac

rm -rf .venv-leg
python3 -m venv .venv-leg && . .venv-leg/bin/activate
pip install -q "${pins[@]}" -e ".[test]"
pip list 2>/dev/null | grep -iE "^(torch|triton|hypothesis|pytest|pytest-xdist) "

python -m pytest "${unit_tests[@]}" -n auto -q -p no:cacheprovider

# The suite as a team runs it: from a directory of its own, through the installed plugin. Failure
# files land in reports/version-leg/.mla_fuse_failures (uploaded with the reports).
rm -rf reports/version-leg && mkdir -p reports/version-leg
(cd reports/version-leg && python -m pytest --pyargs mla_fuse_conformance -n auto -q "${suite_selection[@]}")
