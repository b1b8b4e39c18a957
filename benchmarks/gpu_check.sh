#!/usr/bin/env bash
# The device engine on a GPU, measured in one run (issues 48, 66): builds specdec's C extension in place (no
# network), times the packed GEMM (benchmarks/bench_packed.py), writes random-weight GGUF models here, checks every
# drafter for exactness and runs the bench on them; one JSON (rewritten after each step) and one log in --out
# (benchmarks/gpu_check.py says what and how). Designed to finish within 10 minutes on an H100.
#   benchmarks/gpu_check.sh [--dry-run] [--out DIR] [--tokenizer-from FILE] [--device cuda|cpu] [--threads N]
# --dry-run: the same on the CPU with tiny shapes and short answers (the test suite runs it; under a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON_SET:-}" ] && [ "$PYTHON" = python3 ]; then PYTHON=.venv/bin/python; fi
if ! ls specdec_cli/kernels/_cpu*.so >/dev/null 2>&1; then
  "$PYTHON" setup.py build_ext --inplace -q >/dev/null  # the kernels the GGUF's blocks are repacked with
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
