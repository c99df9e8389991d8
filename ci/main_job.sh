#!/usr/bin/env bash
# The README's main job as a new user runs it, on random seeds (`ci/nightly.sh main-job`): a fresh clone of
# this checkout, the README's install line in a fresh venv, then the README's `mla-fuse verify` (the dev
# profile: random examples) once per seed, each with an example database of its own, so no seed replays
# another's failure. Every run must PASS on our own implementation: a failure is a bug of the product or
# of the suite.
#
# Usage: ci/main_job.sh [SEED ...]   (default: $MAIN_JOB_RUNS seeds, 5, drawn from /dev/urandom and printed)
# Writes reports/main-job/seed-<SEED>/ (verify.log, report.json, summary.md, replay files under failures/)
# and reports/main-job/notes.md: one issue-style note per seed that did not pass (command, machine, the
# failing properties and their replay lines), "every seed passed" else. Exit 1 when a seed did not pass.
# MLA_FUSE_INSTALLED=1 installs nothing: `mla-fuse` and python3 on PATH are used as they are (tests).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/reports/main-job"
seeds=("$@")
if [ ${#seeds[@]} -eq 0 ]; then
  for _ in $(seq "${MAIN_JOB_RUNS:-5}"); do seeds+=("$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"); done
fi
for seed in "${seeds[@]}"; do
  [[ $seed =~ ^[0-9]+$ ]] || { echo "ci/main_job.sh: a seed is a non-negative integer, got '$seed'" >&2; exit 2; }
done
echo "ci/main_job.sh: seeds ${seeds[*]}"
rm -rf "$out" && mkdir -p "$out"
clone=$(mktemp -d)/mla_fuse
git clone -q "$root" "$clone" || exit 2
cd "$clone" || exit 2
# the README's main-job command, its install part (unset CI: a user's shell; the dev profile is the default)
if [ -z "${MLA_FUSE_INSTALLED:-}" ]; then
  python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 triton==3.9.0 -e ".[test]" || exit 2
fi
machine="$(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
status=0
: > "$out/notes.md.part"
for seed in "${seeds[@]}"; do
  dir="$out/seed-$seed"
  mkdir -p "$dir"
  command="mla-fuse verify --report-dir $dir -- --hypothesis-seed=$seed"
  echo "ci/main_job.sh: seed $seed: $command"
  started=$(date +%s)
  env -u CI MLA_FUSE_HYPOTHESIS_DB="$dir/database" MLA_FUSE_FAILURE_DIR="$dir/failures" \
    mla-fuse verify --report-dir "$dir" -- --hypothesis-seed="$seed" > "$dir/verify.log" 2>&1
  code=$?
  verdict=$(grep -m1 '^verdict:' "$dir/verify.log" || echo "verdict: none (exit $code)")
  echo "ci/main_job.sh: seed $seed: $verdict, exit $code, $(( $(date +%s) - started )) s"
  if [ "$code" -ne 0 ]; then
    status=1
    {
      echo "## The README's main job fails on our own implementation with seed $seed"
      echo
      echo "- command (from a fresh clone, after the README's install): \`$command\`, exit $code, $verdict"
      echo "- machine: $machine; $(python3 -c 'import torch, triton, hypothesis; print(f"torch {torch.__version__}, triton {triton.__version__}, hypothesis {hypothesis.__version__}")')"
      echo "- a bug of the product or of the suite: the main job must pass on every seed"
      echo
      echo '```'
      sed -n '/^failures:/,/^$/p' "$dir/verify.log"
      echo '```'
      echo
    } >> "$out/notes.md.part"
  fi
done
if [ "$status" -eq 0 ]; then echo "every seed passed: ${seeds[*]}" > "$out/notes.md.part"; fi
mv "$out/notes.md.part" "$out/notes.md"
cat "$out/notes.md"
exit "$status"
