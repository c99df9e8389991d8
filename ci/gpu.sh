#!/usr/bin/env bash
# GPU job (self-hosted runner with CUDA): the gpu profile of the suite, the verify report and the
# benchmark. Installs the CUDA build of torch 2.13.0 (the CPU pin of .ci/run would not see the GPU)
# with the triton it requires (3.7.1; triton 3.9 does not resolve next to it).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv && . .venv/bin/activate
pip install -q torch==2.13.0 -e ".[dev,bench]"
pytest -n auto --hypothesis-profile=mla_fuse.gpu --junitxml=reports/pytest-gpu.xml
mla-fuse verify --profile gpu --report-dir reports/verify-gpu -n auto
python benchmarks/bench_ops.py --out reports/bench
