#!/usr/bin/env bash
# Ahead-of-time GPU compile check: every kernel variant compiles for sm_90 (and sm_80 where the
# cache dtype allows) with triton.compile, on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
pytest tests/test_aot_compile.py -q
