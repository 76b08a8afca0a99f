#!/bin/bash
# Stage 2, final call A: GPU tests, then every benchmark figure except the transformers peer
# (stage2_peer.sh). Run after `source scripts/device/prelude.sh`; logs and JSON under $OUT.
set -o pipefail
B="python3 benchmarks/offline.py"
quiet() { grep -v '^{' | grep -v -i warn; }
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_engine_gpu.py \
    tests/gpu/test_flashinfer_backend.py 2>&1 | tee $OUT/gpu_tests.log | tail -4
timeout 150 $B --variants default,no-overlap,no-cuda-graph,naive,page1 --out $OUT/ablations.json \
    2>&1 | tee $OUT/ablations.log | quiet | tail -8
RADIXQ_TRITON=0 timeout 60 $B --out $OUT/no_triton.json 2>&1 | tee $OUT/no_triton.log | quiet | tail -2
timeout 90 $B --variants default,no-overlap --profile-steps --out $OUT/profile.json 2>&1 \
    | tee $OUT/profile.log | quiet | tail -14
timeout 100 $B --model configs/qwen3-8b.json --out $OUT/qwen3_8b.json 2>&1 | tee $OUT/qwen3_8b.log | quiet | tail -3
timeout 120 python3 benchmarks/queue_e2e_gpu.py --baseline-json $OUT/ablations.json --out $OUT/queue_e2e.json \
    2>&1 | tee $OUT/queue_e2e.log | grep -E "queue e2e|overhead|Error|error" | tail -4
python3 benchmarks/floor.py configs/qwen3-0.6b.json configs/qwen3-8b.json
