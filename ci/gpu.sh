#!/usr/bin/env bash
# GPU job (self-hosted runner with CUDA): the verify report in the gpu profile, the benchmark and
# the suite in the gpu profile, each step run even when an earlier one failed; exit 1 if any did.
#
# Online (default): installs the CUDA build of torch 2.13.0 (the CPU pin of .ci/run would not see
# the GPU) with the triton it requires (3.7.1; triton 3.9 does not resolve next to it).
# Offline runner whose python3 already holds a CUDA build of torch and triton:
#   MLA_FUSE_WHEELS=DIR  installs the wheels in DIR (mla_fuse's, any of the test extra the machine
#                        lacks), no index, no dependencies, into that python3's own environment
#                        (make them where pip works: `pip wheel --no-deps -w DIR .`).
# MLA_FUSE_GPU_STEPS     the steps, in order (default: "verify bench test compile")
# MLA_FUSE_GPU_TESTS     the test step's tests/ files (default: the kernel and op tests that build their
#                        tensors on the kernels' device; the compile step runs the pass tests)
# compile step:          ci/gpu_compile_check.py (a DeepSeek-shaped decoder through Inductor's Triton code
#                        generation, O2 vs O1 bitwise, CUDA graph replay) and the pass tests of tests/, which
#                        build their models on the kernels' device
# MLA_FUSE_STEP_SECONDS  a limit per step (default: none); a step past it counts as failed
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MLA_FUSE_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --force-reinstall "$MLA_FUSE_WHEELS"/*.whl || exit 1
else
  python3 -m venv .venv && . .venv/bin/activate || exit 1
  pip install -q torch==2.13.0 -e ".[dev,bench]" || exit 1
fi
python3 -c 'import torch, triton, hypothesis, mla_fuse
print("torch", torch.__version__, "triton", triton.__version__, "hypothesis", hypothesis.__version__,
      "mla_fuse", mla_fuse.__version__, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
limit=(timeout "${MLA_FUSE_STEP_SECONDS:-0}")
failed=()
for step in ${MLA_FUSE_GPU_STEPS:-verify bench test compile}; do
  echo "== $step ($(date -u +%H:%M:%S))"
  case $step in
    verify) "${limit[@]}" mla-fuse verify --profile gpu --report-dir reports/verify-gpu -n auto ;;
    bench) "${limit[@]}" python3 benchmarks/bench_ops.py --out reports/bench ;;
    test) "${limit[@]}" python3 -m pytest -n auto --hypothesis-profile=mla_fuse.gpu --junitxml=reports/pytest-gpu.xml \
            --pyargs mla_fuse_conformance --mla-fuse-impl=triton; suite=$?
          "${limit[@]}" python3 -m pytest -n auto --hypothesis-profile=mla_fuse.gpu \
            --junitxml=reports/pytest-gpu-tests.xml ${MLA_FUSE_GPU_TESTS:-tests/test_kernels.py tests/test_custom_ops.py \
            tests/test_overlap.py tests/test_bad_input_crashes.py} && [ $suite -eq 0 ] ;;
    compile) "${limit[@]}" python3 ci/gpu_compile_check.py; check=$?
             "${limit[@]}" python3 -m pytest -n auto --hypothesis-profile=mla_fuse.gpu \
               --junitxml=reports/pytest-gpu-passes.xml tests/test_passes_mla.py tests/test_passes_mha.py \
               tests/test_pass_regressions.py tests/test_pass_situations.py && [ $check -eq 0 ] ;;
    *) echo "unknown step: $step (verify, bench, test, compile)"; false ;;
  esac || failed+=("$step")
done
echo "== done ($(date -u +%H:%M:%S)); failed: ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
