#!/bin/bash
# Stage 2, final call B: engine-only baseline (default + a clean no-overlap ablation), the queue
# end to end against it (plain, then once with the scheduler's step profile), then radixq and
# transformers' continuous batching on the same requests in one process (~4.5 min).
set -o pipefail
quiet() { grep -v '^{' | grep -v -i warn; }
timeout 70 python3 benchmarks/offline.py --variants default,no-overlap --out $OUT/baseline.json 2>&1 \
    | tee $OUT/baseline.log | quiet | tail -3
python3 -c "import json; [print(r['engine'], r['steps'], r['retractions'], r['kv_pages']) for r in json.load(open('$OUT/baseline.json'))]"
timeout 75 python3 benchmarks/queue_e2e_gpu.py --baseline-json $OUT/baseline.json --out $OUT/queue_e2e.json \
    2>&1 | tee $OUT/queue_e2e.log | grep -E "queue e2e|overhead|Error" | tail -3
RADIXQ_STEP_PROFILE=1 timeout 60 python3 benchmarks/queue_e2e_gpu.py --repeat 1 --baseline-json $OUT/baseline.json \
    2>&1 | tee $OUT/queue_e2e_profiled.log | grep -E "queue e2e|overhead|Error" | tail -3
timeout 330 python3 benchmarks/offline.py --peer hf --out $OUT/peer_hf.json 2>&1 | tee $OUT/peer_hf.log | quiet | tail -4
