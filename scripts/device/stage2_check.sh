#!/bin/bash
# Stage 2, first call: GPU tests of the fast path, then the standard benchmark once per
# variant in separate processes (a crash in one leaves the others), with the step profile.
# Run after `source scripts/device/prelude.sh`; logs under $OUT.
set -o pipefail
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv,noheader
timeout ${TEST_TIMEOUT_S:-150} python3 -m pytest -q -x -m gpu -p no:cacheprovider \
    tests/gpu/test_engine_gpu.py ${EXTRA_TESTS} 2>&1 | tee $OUT/gpu_tests.log | tail -25
for variant in ${VARIANTS:-default no-cuda-graph no-overlap}; do
    timeout ${BENCH_TIMEOUT_S:-120} python3 benchmarks/offline.py --variants $variant --profile-steps \
        --out $OUT/bench_$variant.json 2>&1 | tee $OUT/bench_$variant.log | grep -v '^{' | grep -v Warning | tail -12
done
