#!/bin/bash
# Stage 3, final call A (carry .whl .fi_cache .redis): GPU tests; the standard benchmark three
# times with transformers' continuous batching on the same requests in the same process; the
# step profile; the queue end to end three times against those engine-only runs.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
quiet() { grep -v '^{' | grep -v -i warn; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, flashinfer, triton; print('torch', torch.__version__, 'flashinfer', flashinfer.__version__, 'triton', triton.__version__)"
echo "== GPU tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu 2>&1 | tee $OUT/gpu_tests.log | tail -3
echo "== standard benchmark x3 + transformers peer"
timeout 330 python3 benchmarks/offline.py --repeat 3 --profile-steps --peer hf --out $OUT/bench.json \
    2>&1 | tee $OUT/bench.log | quiet | tail -12
python3 -c "import json; print('runs', [round(x, 3) for x in json.load(open('$OUT/bench.json'))[0]['runs_s']])"
echo "== queue e2e x3"
timeout 200 python3 benchmarks/queue_e2e_gpu.py --baseline-json $OUT/bench.json --out $OUT/queue_e2e.json \
    2>&1 | tee $OUT/queue_e2e.log | grep -E "queue e2e|overhead|Error|error" | tail -5
python3 -c "import json; print('e2e runs', [round(x, 3) for x in json.load(open('$OUT/queue_e2e.json'))['e2e_runs_s']])"
