#!/bin/bash
# Stage 3, third call (carry .whl .fi_cache .redis): GPU tests after the kernel changes
# (one-program-per-token qk-norm/rope/store, two-pass sampler hashing its own uniforms), the
# standard benchmark, the decode + prefill breakdown, and a first Llama-3.1-8B run.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
echo "== GPU tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu 2>&1 | tee $OUT/gpu_tests.log | tail -6
echo "== standard benchmark"
timeout 200 python3 benchmarks/offline.py --profile-steps --out $OUT/bench.json \
    2>&1 | grep -v '^{' | grep -v Warning | tail -8
echo "== decode + prefill breakdown"
timeout 150 python3 benchmarks/decode_breakdown.py engine --out $OUT/engine.json 2>&1 | grep -v Warning | tail -65
echo "== Llama-3.1-8B"
timeout 200 python3 benchmarks/offline.py --model configs/llama-3.1-8b.json --out $OUT/bench_llama8b.json \
    2>&1 | grep -v '^{' | grep -v Warning | tail -4
