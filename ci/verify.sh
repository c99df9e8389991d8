#!/usr/bin/env bash
# The main job: verify the default implementation and write report.json + junit.xml.
# Usage: ci/verify.sh [PROFILE] (default: ci). Needs the .venv made by .ci/run or ci/gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
mla-fuse verify --profile "${1:-ci}" --report-dir reports/verify -n auto
