#!/bin/bash
# Stage 3, first call (carry .whl .redis): rebuild the FlashInfer JIT cache, then measure where the
# decode time goes (benchmarks/decode_breakdown.py engine), which decode attention kernel reads
# the KV fastest (... attention), and the standard benchmark as a baseline.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
echo "== JIT (fa2 prefill + decode)"
( time timeout 200 python3 scripts/device/warm_flashinfer.py ) 2>&1 | tail -4
echo "== JIT in the background: XQA and fa3 modules"
timeout 300 python3 benchmarks/decode_breakdown.py attention --steps 1000 --reps 1 \
    --variants xqa-p16-nhd,fa3-p1-nhd,tc-p16-hnd > $OUT/jit_extra.log 2>&1 &
JIT_PID=$!
echo "== engine breakdown"
timeout 200 python3 benchmarks/decode_breakdown.py engine --out $OUT/engine.json 2>&1 | grep -v Warning | tail -16
echo "== standard benchmark (baseline of this tree)"
timeout 150 python3 benchmarks/offline.py 2>&1 | grep -v '^{' | grep -v Warning | tail -3
wait $JIT_PID; tail -3 $OUT/jit_extra.log
echo "== attention variants"
timeout 240 python3 benchmarks/decode_breakdown.py attention --out $OUT/attention.json 2>&1 | grep -v Warning | tail -90
tar -czf /tmp/flashinfer_cache.tgz -C ~/.cache flashinfer && ls -la /tmp/flashinfer_cache.tgz
split -b 15M -d -a 1 /tmp/flashinfer_cache.tgz "$OUT/flashinfer_cache.tgz.part"
