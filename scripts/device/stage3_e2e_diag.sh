#!/bin/bash
# Stage 3, queue diagnosis (carry .whl .fi_cache .redis): engine alone x3 with a step profile,
# then the queue end to end x3 with the worker's scheduler recording the same profile.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
timeout 150 python3 benchmarks/offline.py --repeat 3 --profile-steps --out $OUT/bench.json \
    2>&1 | tee $OUT/bench.log | grep -v '^{' | grep -v -i warn | tail -6
python3 -c "import json; print('engine runs', [round(x, 3) for x in json.load(open('$OUT/bench.json'))[0]['runs_s']])"
RADIXQ_STEP_PROFILE=1 timeout 200 python3 benchmarks/queue_e2e_gpu.py --baseline-json $OUT/bench.json \
    --out $OUT/queue_e2e.json > $OUT/queue_e2e.log 2>&1
grep -E "queue e2e|overhead|Error" $OUT/queue_e2e.log | tail -4
python3 -c "import json; print('e2e runs', [round(x, 3) for x in json.load(open('$OUT/queue_e2e.json'))['e2e_runs_s']])"
python3 - "$OUT/queue_e2e.log" <<'PY'
import json, re, sys
for line in open(sys.argv[1]):
    if "step profile:" in line:
        p = json.loads(line.split("step profile:", 1)[1])
        d = p.get("decode", {})
        print("worker: steps", p.get("steps"), "decode n", d.get("steps"), "gpu sum", round(d.get("gpu_ms", {}).get("sum", 0) / 1e3, 2),
              "host sum", round(d.get("host_ms", {}).get("sum", 0) / 1e3, 2), "gap", p.get("gpu_gap_ms"), "busy", p.get("gpu_busy_share"))
        pre = p.get("prefill", {})
        print("worker prefill n", pre.get("steps"), "gpu sum", round(pre.get("gpu_ms", {}).get("sum", 0) / 1e3, 2))
PY
