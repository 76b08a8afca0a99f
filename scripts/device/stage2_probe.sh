#!/bin/bash
# Stage 2, second call: GPU tests, the 0.6B benchmark with step + kernel profiles, a first 8B run.
set -o pipefail
timeout 150 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/gpu/test_engine_gpu.py 2>&1 \
    | tee $OUT/gpu_tests.log | tail -8
timeout 150 python3 benchmarks/offline.py --profile-steps --kernel-profile 200 --out $OUT/bench_default.json \
    2>&1 | tee $OUT/bench_default.log | grep -v '^{' | grep -v Warning | tail -45
timeout 170 python3 benchmarks/offline.py --model configs/qwen3-8b.json --profile-steps --out $OUT/bench_8b.json \
    2>&1 | tee $OUT/bench_8b.log | grep -v '^{' | grep -v Warning | tail -12
