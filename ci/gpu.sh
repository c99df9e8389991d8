#!/usr/bin/env bash
# GPU job (a runner with CUDA): steps that together fit one 15-minute job, each under its own time
# limit, each run even when an earlier one failed, ending in a one-screen summary; exit 1 if any failed.
#
#   dispatch  host microseconds per eager call, torch.ops and mla_fuse.ops, real launches, with
#             and without the kept launches and the launch tables, and where a call's host time
#             goes (cProfile) (benchmarks/bench_validation.py --device cuda --launch)      default 45 s
#   bench     the fused op eager / under CUDA-graph replay / host us, against the unfused pair,
#             FlagGems (when importable) and a device copy of the same bytes (bench_ops.py)   120 s
#   tiles     the fused op's launch configurations under CUDA-graph replay against a copy, for the
#             prefill rows under 85% of a copy (benchmarks/bench_tiles.py; what config picks, and
#             the best of a grid of tokens/heads per program and warps, each checked bytewise) 240 s
#   compile   the compile path on CUDA Inductor (Triton code generation): ci/gpu_compile_check.py
#             (a DeepSeek-shaped decoder at O2 vs O1, recompiles, CUDA-graph replay) and the
#             pass tests of tests/, which build their models on the kernels' device            150 s
#   keys      compiled-kernel budget: one property in the gpu profile on an empty Triton cache,
#             then again with the same seed on that cache (must compile nothing new)          150 s
#   repro     the reproducers' CUDA path: a planted bug's cell, its script run with DEVICE='cuda'
#             (reproduces; passes with --reference)                                          120 s
#   verify    mla-fuse verify --profile gpu, the whole profile (kernels compiled are counted,  420 s
#             the 15 slowest tests printed)
#             (on an empty Triton cache an H200 ran 160 of its 250 properties in 6 minutes:
#             keep the cache between runs, or give a cold run MLA_FUSE_LIMIT_verify=600)
#   test      the suite (gpu profile) and the tests/ files that run on the kernels' device     480 s
#   peers     the third-party Triton kernels natively (docs/THIRD_PARTY.md): mla-fuse verify    600 s
#             --impl flaggems, liger, sglang-triton, flash-attn-rotary, lmdeploy, gpu profile, each under
#             a fifth of the step's limit (reports/gpu/peers/<impl>/). Each package from the adapter's
#             variable where it is set (MLA_FUSE_FLAGGEMS_PATH, _LIGER_PATH, _SGLANG_PATH,
#             _FLASH_ATTN_PATH, _LMDEPLOY_PATH: a directory holding it, e.g. only SGLang's two kernel
#             files; LMDeploy's 107 MB wheel is past the GPU machine's carry limit, its kernel files are not), else its
#             wheel (flash-attn: sdist) in $MLA_FUSE_WHEELS, else pip download / ci/fetch_sdist.py,
#             unpacked into a temporary directory the variable then names (read, never imported). A
#             failing kernel is the finding; the step fails when a verify could not run (exit 2), ran
#             past its share (124) or a package is missing
#
# MLA_FUSE_GPU_STEPS     the steps, in order (default: "dispatch bench compile repro verify", 855 s
#                        of limits: one 15-minute job; tiles, keys, test and peers are for a job of their own)
# MLA_FUSE_STEP_SECONDS  one limit for every step instead of the defaults above, and
# MLA_FUSE_LIMIT_<step>  one step's limit (MLA_FUSE_LIMIT_verify=300); a step past its limit counts
#                        as failed, and what it printed is kept in reports/gpu/<step>.log
# MLA_FUSE_BENCH_ARGS    arguments for bench_ops.py (default: its own token and head counts)
# MLA_FUSE_TILES_ARGS    arguments for bench_tiles.py (default: T 4096 and 16384, H 16 and 128, both caches)
# MLA_FUSE_GPU_TESTS     the test step's tests/ files (default: the kernel, op and pass tests)
#
# The reports: reports/gpu/ (versions.txt, summary.txt, steps.tsv, <step>.log) and reports/bench/ (the bench
# step's JSON and plot). Keep them as benchmarks/results/gpu-<date>/ (cp -r reports/gpu reports/bench DIR)
# and regenerate docs/GPU.md's table of targets: python3 ci/gpu_tables.py benchmarks/results/gpu-* --write docs/GPU.md
#
# Triton's cache: compiled kernels are kept in $TRITON_CACHE_DIR (Triton's default:
# ~/.triton/cache). Keep that directory between runs (the workflow caches it) and a rerun compiles
# only kernels it has not seen; the verify step prints how many it compiled. For a cold measurement
# point TRITON_CACHE_DIR at an empty directory.
#
# Online (default): installs the CUDA build of torch 2.13.0 with the test and bench extras.
# Offline runner whose python3 already holds a CUDA build of torch (>= 2.11) and triton (>= 3.6):
#   MLA_FUSE_WHEELS=DIR  installs every wheel in DIR (mla_fuse's: `pip wheel --no-deps -w DIR .`;
#                        flag-gems, sqlalchemy and greenlet for the FlagGems peer of the bench step;
#                        flag-gems, liger-kernel and lmdeploy for the peers step, which reads them from DIR, and
#                        flash-attn's sdist; any of the test extra the machine lacks) with no index and no
#                        dependencies; SGLang's wheel, if there, is not installed (the peers step reads it)
#   MLA_FUSE_INSTALLED=1 installs nothing: python3 already imports mla_fuse and its test extra.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MLA_FUSE_INSTALLED:-}" ]; then
  :  # mla_fuse and its test extra are already importable by python3 (a prepared image, a venv)
elif [ -n "${MLA_FUSE_WHEELS:-}" ]; then
  # every wheel but SGLang's (cp311-tagged and never installed: the peers step reads its kernel files)
  python3 -m pip install -q --no-index --no-deps --force-reinstall $(ls "$MLA_FUSE_WHEELS"/*.whl | grep -v '/sglang-') \
    || exit 1
else
  python3 -m venv .venv && . .venv/bin/activate || exit 1
  pip install -q torch==2.13.0 -e ".[dev,bench]" || exit 1
fi
mkdir -p reports/gpu
python3 -c 'import torch, triton, hypothesis, mla_fuse
print("torch", torch.__version__, "triton", triton.__version__, "hypothesis", hypothesis.__version__,
      "mla_fuse", mla_fuse.__version__, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' \
  | tee reports/gpu/versions.txt

declare -A LIMIT=([dispatch]=45 [bench]=120 [tiles]=240 [compile]=150 [keys]=150 [repro]=120 [verify]=420 [test]=480 [peers]=600)
cache_dir=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
kernels() { find "$1" -name '*.cubin' -o -name '*.hsaco' 2>/dev/null | wc -l; }
suite=(python3 -m pytest -p no:cacheprovider --pyargs mla_fuse_conformance --mla-fuse-impl=triton)

step_keys() {  # one property, an empty cache, then the same seed again on that cache
  local cold property=test_mla_cache_write_matches_reference
  cold=$(mktemp -d)
  for run in first again; do
    TRITON_CACHE_DIR=$cold "${suite[@]}" -q -n auto --hypothesis-profile=mla_fuse.gpu --hypothesis-seed=0 \
      -k "$property" || return 1
    echo "summary: $property, gpu profile, seed 0, $run run: $(kernels "$cold") kernels in the cache"
  done
}

step_repro() {  # a planted bug on CUDA: each cell's reproducer must name DEVICE='cuda', reproduce, pass --reference
  local dir=reports/gpu/repro
  rm -rf "$dir" && mkdir -p "$dir"
  mla-fuse verify --impl mutant:sin_sign_flipped --profile dev --map-rounds 1 -n 4 --report-dir "$dir" \
    -- -k test_fused_mla_matches_reference | tee "$dir.out"
  local made reproduced cuda
  made=$(grep -c '^reproducer: ' "$dir.out")
  reproduced=$(grep -c '^reproducer: .*(reproduced)$' "$dir.out")
  cuda=$(grep -l "DEVICE.*= .*'cuda'" "$dir"/reproducers/*.py 2>/dev/null | wc -l)
  echo "summary: $made reproducers, $reproduced reproduced and passed with --reference, $cuda with DEVICE='cuda'"
  [ "${made:-0}" -gt 0 ] && [ "$made" = "$reproduced" ] && [ "$made" = "$cuda" ]
}

step_peers() {  # the third-party Triton kernels on the GPU, read from their wheels / sdist (unpacked, never imported)
  local unpacked each impl package kind pin var found path out code status=0
  local peers=("flaggems flag_gems wheel flag-gems==5.0.2 MLA_FUSE_FLAGGEMS_PATH"
               "liger liger_kernel wheel liger-kernel==0.8.5 MLA_FUSE_LIGER_PATH"
               "sglang-triton sglang wheel sglang==0.5.23 MLA_FUSE_SGLANG_PATH"
               "flash-attn-rotary flash_attn sdist flash-attn==2.8.3.post2 MLA_FUSE_FLASH_ATTN_PATH"
               "lmdeploy lmdeploy wheel lmdeploy==0.18.0 MLA_FUSE_LMDEPLOY_PATH")
  unpacked=$(mktemp -d)
  each=$((step_limit > 30 * ${#peers[@]} ? step_limit / ${#peers[@]} - 15 : 15))  # each verify's share (all report)
  for peer in "${peers[@]}"; do
    read -r impl package kind pin var <<< "$peer"
    path=${!var:-}  # given: a directory holding the package (only its kernel files are read)
    if [ -n "$path" ]; then
      found="$var=$path"
    else
      if [ -n "${MLA_FUSE_WHEELS:-}" ]; then
        found=$(ls "$MLA_FUSE_WHEELS/$package"-*"$([ "$kind" = wheel ] && echo .whl || echo .tar.gz)" 2>/dev/null \
                | tail -1)
        if [ -z "$found" ]; then
          echo "summary: $impl: no $package $kind in $MLA_FUSE_WHEELS (nor $var)"; status=1; continue
        fi
      elif [ "$kind" = wheel ]; then
        found=$(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
                  --platform manylinux_2_34_x86_64 "$pin" -d "$unpacked" && ls "$unpacked/$package"-*.whl | tail -1)
      else
        found=$(python3 ci/fetch_sdist.py "${pin%%==*}" "${pin##*==}" "$unpacked")
      fi
      path=$unpacked/$impl
      if [ -n "$found" ] && [ "$kind" = wheel ]; then
        python3 -m zipfile -e "$found" "$path" || found=""
      elif [ -n "$found" ]; then  # an sdist: its top directory holds the package
        { mkdir -p "$path" && tar -xzf "$found" -C "$path" && path=$(ls -d "$path"/*/ | head -1); } || found=""
      fi
      if [ -z "$found" ]; then
        echo "summary: $impl: no $package $kind from ${MLA_FUSE_WHEELS:-the index ($pin)}"
        status=1; continue
      fi
      found=$(basename "$found")
    fi
    out=reports/gpu/peers/$impl
    rm -rf "$out" && mkdir -p "$out"
    env "$var=$path" MLA_FUSE_FAILURE_DIR="$out/failures" timeout --kill-after=10 "$each" \
      mla-fuse verify --impl "$impl" --profile gpu --report-dir "$out" --map-seconds 60 -n auto > "$out/verify.log" 2>&1
    code=$?
    echo "summary: $impl, $found: verify --profile gpu exit $code (0 conforms, 1 does not, 2 could not" \
         "run, 124 past ${each} s); $(grep -a '^verdict: ' "$out/verify.log" | tail -1)"
    if [ "$code" -ge 2 ]; then status=1; tail -5 "$out/verify.log"; fi  # a failing kernel is the finding
  done
  rm -rf "$unpacked"
  return $status
}

run_step() {
  case $1 in
    dispatch) python3 benchmarks/bench_validation.py --device cuda --launch ;;
    bench) python3 benchmarks/bench_ops.py --out reports/bench ${MLA_FUSE_BENCH_ARGS:-} ;;
    tiles) python3 benchmarks/bench_tiles.py ${MLA_FUSE_TILES_ARGS:-} ;;
    compile) python3 ci/gpu_compile_check.py; local check=$?
             python3 -m pytest -p no:cacheprovider -q -n auto --junitxml=reports/pytest-gpu-passes.xml \
               tests/test_passes_mla.py tests/test_passes_mha.py tests/test_pass_regressions.py \
               tests/test_pass_situations.py && [ $check -eq 0 ] ;;
    keys) step_keys ;;
    repro) step_repro ;;
    verify) local before after status
            before=$(kernels "$cache_dir")
            mla-fuse verify --profile gpu --report-dir reports/gpu/verify -n auto -- --durations=15; status=$?
            after=$(kernels "$cache_dir")
            echo "summary: verify --profile gpu exit $status; $((after - before)) kernels compiled ($after in $cache_dir)"
            return $status ;;
    peers) step_peers ;;
    test) "${suite[@]}" -n auto --hypothesis-profile=mla_fuse.gpu --junitxml=reports/pytest-gpu.xml; local status=$?
          python3 -m pytest -p no:cacheprovider -n auto --junitxml=reports/pytest-gpu-tests.xml \
            ${MLA_FUSE_GPU_TESTS:-tests/test_kernels.py tests/test_custom_ops.py tests/test_overlap.py \
            tests/test_bad_input_crashes.py tests/test_passes_mla.py tests/test_passes_mha.py tests/test_launcher.py} \
            && [ $status -eq 0 ] ;;
    *) echo "unknown step: $1 (${!LIMIT[*]})"; return 2 ;;
  esac
}

export -f run_step step_keys step_repro step_peers kernels  # for the child shell of each step
export cache_dir
summary=()
failed=0
touch reports/gpu/steps.tsv  # step, verdict, seconds, limit, appended: ci/gpu_tables.py reads a step's last line
for step in ${MLA_FUSE_GPU_STEPS:-dispatch bench compile repro verify}; do
  own=MLA_FUSE_LIMIT_$step
  limit=${!own:-${MLA_FUSE_STEP_SECONDS:-${LIMIT[$step]:-600}}}
  echo "== $step (limit ${limit} s, $(date -u +%H:%M:%S))"
  started=$SECONDS
  # the step in a child shell of its own, so that `timeout` can stop it and everything it started
  timeout --kill-after=10 "$limit" bash -c "suite=(${suite[*]}); step_limit=$limit; run_step $step" 2>&1 \
    | tee "reports/gpu/$step.log"
  status=${PIPESTATUS[0]}
  seconds=$((SECONDS - started))
  verdict=$([ "$status" -eq 0 ] && echo ok || { [ "$status" -eq 124 ] && echo "TIMED OUT" || echo "FAILED ($status)"; })
  [ "$status" -eq 0 ] || failed=1
  summary+=("$(printf '%-9s %-11s %5s s' "$step" "$verdict" "$seconds")")
  printf '%s\t%s\t%s\t%s\n' "$step" "$verdict" "$seconds" "$limit" >> reports/gpu/steps.tsv
  # the step's own summary lines, else pytest's closing line, else its last line
  lines=$(grep -a '^summary: ' "reports/gpu/$step.log" || grep -aE '[0-9]+ (passed|failed)' "reports/gpu/$step.log" \
          | tail -1 || tail -1 "reports/gpu/$step.log")
  while IFS= read -r line; do [ -n "$line" ] && summary+=("          ${line#summary: }"); done \
    < <(printf '%s\n' "$lines" | cut -c1-150)
done
{ echo "== summary ($(date -u +%H:%M:%S); $(cat reports/gpu/versions.txt))"; printf '%s\n' "${summary[@]}"; } \
  | tee reports/gpu/summary.txt
exit $failed
