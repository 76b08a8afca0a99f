#!/bin/bash
# Stage 3, fourth call (carry .whl .fi_cache .redis): GPU tests, the standard benchmark three
# times (fresh prompts each), split-KV off vs on for tensor-core decode, queue end to end x3.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
echo "== GPU tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu 2>&1 | tee $OUT/gpu_tests.log | tail -4
echo "== standard benchmark x3"
timeout 200 python3 benchmarks/offline.py --repeat 3 --profile-steps --out $OUT/bench.json \
    2>&1 | tee $OUT/bench.log | grep -v '^{' | grep -v Warning | tail -8
python3 -c "import json; print('runs', [round(x, 3) for x in json.load(open('$OUT/bench.json'))[0]['runs_s']])"
echo "== split-KV"
timeout 100 python3 benchmarks/decode_breakdown.py attention --variants tc-p16-hnd,tcns-p16-hnd \
    --steps 0,128,256,512,640 2>&1 | grep -v Warning | grep -v "step " | tail -4
echo "== queue e2e x3"
timeout 200 python3 benchmarks/queue_e2e_gpu.py --baseline-json $OUT/bench.json --out $OUT/queue_e2e.json \
    2>&1 | tee $OUT/queue_e2e.log | grep -E "queue e2e|overhead|Error|error|e2e_runs" | tail -5
