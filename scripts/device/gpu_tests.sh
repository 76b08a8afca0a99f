#!/bin/bash
# The GPU tests on the device machine, from the repository root (carry .whl, .fi_cache, .redis):
#   bash scripts/device/gpu_tests.sh [PYTEST_ARGS...]
# Sources prelude.sh, prints the versions that matter, runs `pytest -m gpu tests/gpu` (plus any
# arguments) and writes the log to $OUT/gpu_tests.log (OUT defaults to /tmp/out).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, flashinfer, triton; print('torch', torch.__version__, 'flashinfer', \
flashinfer.__version__, 'triton', triton.__version__)"
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu "$@"
} 2>&1 | tee "$OUT/gpu_tests.log"
