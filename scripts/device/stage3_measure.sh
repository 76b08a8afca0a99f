#!/bin/bash
# Stage 3, second call (carry .whl .fi_cache .redis): GPU tests on the HND page-16 pool, the
# standard benchmark (page 16 default vs page 1) with a step profile, the decode breakdown, and
# the breakdown again with cuBLASLt preferred for the GEMMs.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
echo "== GPU tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu 2>&1 | tee $OUT/gpu_tests.log | tail -6
echo "== standard benchmark"
timeout 200 python3 benchmarks/offline.py --variants default,page1 --profile-steps --out $OUT/bench.json \
    2>&1 | grep -v '^{' | grep -v Warning | tail -12
echo "== decode breakdown"
timeout 150 python3 benchmarks/decode_breakdown.py engine --out $OUT/engine.json 2>&1 | grep -v Warning | tail -60
echo "== decode breakdown, cuBLASLt preferred"
TORCH_BLAS_PREFER_CUBLASLT=1 timeout 120 python3 benchmarks/decode_breakdown.py engine --steps 0,512,896 \
    --show-kernels 896 2>&1 | grep -v Warning | tail -30
