#!/bin/bash
# Stage 3, final call B (carry .whl .fi_cache .redis): the ablations, fused kernels off, the two
# 8B-class models, and the floors.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
quiet() { grep -v '^{' | grep -v -i warn; }
B="python3 benchmarks/offline.py"
echo "== ablations"
timeout 240 $B --variants default,no-overlap,no-cuda-graph,naive,page1 --out $OUT/ablations.json \
    2>&1 | tee $OUT/ablations.log | quiet | tail -7
echo "== fused kernels off"
RADIXQ_TRITON=0 timeout 90 $B --out $OUT/no_triton.json 2>&1 | tee $OUT/no_triton.log | quiet | tail -2
echo "== 8B-class"
timeout 120 $B --model configs/llama-3.1-8b.json --out $OUT/llama8b.json 2>&1 | tee $OUT/llama8b.log | quiet | tail -2
timeout 120 $B --model configs/qwen3-8b.json --out $OUT/qwen3_8b.json 2>&1 | tee $OUT/qwen3_8b.log | quiet | tail -2
python3 benchmarks/floor.py configs/qwen3-0.6b.json configs/llama-3.1-8b.json configs/qwen3-8b.json
