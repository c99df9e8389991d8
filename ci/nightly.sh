#!/usr/bin/env bash
# One step of the nightly campaign (.github/workflows/nightly.yml, docs/FUZZING.md).
#   ci/nightly.sh campaign   fuzz for $CAMPAIGN_MINUTES (default 240) against $CAMPAIGN_IMPL (default
#                            triton), one worker per GPU; summary and logs in reports/fuzz/, replay
#                            files in .mla_fuse_failures/; exit status 1 when a property failed
#   ci/nightly.sh export     the whole shared database as reports/fuzz-database.zip
# The shared database is $MLA_FUSE_HYPOTHESIS_DB (redis://[:password@]host:port/db).
# Installs the CUDA build of torch 2.13.0 (the CPU pin of .ci/run would not see the GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MLA_FUSE_HYPOTHESIS_DB:?set MLA_FUSE_HYPOTHESIS_DB to the shared database (redis://host:port/db)}"
python3 -m venv .venv && . .venv/bin/activate
pip install -q torch==2.13.0 triton==3.9.0 -e ".[test]"
case "${1:-}" in
    campaign)
        mla-fuse fuzz --impl "${CAMPAIGN_IMPL:-triton}" --minutes "${CAMPAIGN_MINUTES:-240}" \
            --db "$MLA_FUSE_HYPOTHESIS_DB" --out reports/fuzz ;;
    export)
        mkdir -p reports
        mla-fuse db export reports/fuzz-database.zip --db "$MLA_FUSE_HYPOTHESIS_DB" ;;
    *)
        echo "usage: ci/nightly.sh campaign|export" >&2
        exit 2 ;;
esac
