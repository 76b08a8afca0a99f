#!/bin/bash
# Tensor parallelism on two GPUs (issue 34), from the repository root on nvidia-h200-x2 (carry
# .whl, .fi_cache, .redis):
#   bash scripts/device/tp_checks.sh [PART...]        # PART: nccl kill pool atscale (default: all)
# nccl     tests/gpu/test_tp_nccl.py: TP=2 tokens against TP=1, decode from CUDA graphs with the
#          all-reduce captured, then every rank leaves the group the normal way (the hang of issue 34)
# kill     tests/gpu/test_tp_worker_gpu.py: kill -9 of rank 1 under `radixq worker --tp 2`, every job
#          answered once, the killed group gone, a new group serving (its timings printed)
# pool     benchmarks/prefix_pool.py --preset h200 --workers 1,2 --partitions 16 --num-pages 2000
#          (POOL_REPEAT rounds, default 3)
# atscale  benchmarks/at_scale.py, Llama-3.1-8B (dummy), FP8 weights + FP8 KV: one TP=1 worker, one
#          TP=2 worker, two TP=1 workers on one queue; ATSCALE_ROUNDS rounds (default 3) on one start
#          of each, shape cut by ATSCALE_SHAPE (default 512 requests x 1000/250 tokens)
# Every part runs under `timeout` within one budget (TOTAL_S, default 470 s from the start), so the
# table comes last whatever happens. Logs: $OUT/tp_PART.log (OUT defaults to /tmp/out), the
# benchmarks' JSON beside them, the table in $OUT/tp_table.txt (8 files at most: what $OUT returns).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TOTAL_S=${TOTAL_S:-470}
POOL_REPEAT=${POOL_REPEAT:-3}
ATSCALE_ROUNDS=${ATSCALE_ROUNDS:-3}
ATSCALE_SHAPE=${ATSCALE_SHAPE:---num-requests 512 --prompt-len 1000 --output-len 250 --max-running-reqs 512}
began=$(date +%s)
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(nccl kill pool atscale)
for part in "${parts[@]}"; do
    case $part in nccl | kill | pool | atscale) ;; *) echo "tp_checks: unknown part $part" >&2; exit 2 ;; esac
done
source scripts/device/prelude.sh || exit 1
# NOTE: prelude exports these; every process below inherits them (and TPGroup sets them again)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader | tee "$OUT/tp_checks.log"

declare -A status
run_part() {  # NAME CAP_S COMMAND...: run under min(CAP_S, what the budget has left - 15 s)
    local name=$1 cap=$2
    shift 2
    local left=$((TOTAL_S - ($(date +%s) - began) - 15))
    local limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 30 ]; then
        status[$name]="skipped (budget)"
        echo "tp_checks: $name skipped: ${left} s left of TOTAL_S=$TOTAL_S" | tee -a "$OUT/tp_$name.log"
        return
    fi
    local start=$(date +%s)
    echo "=== $name (limit ${limit} s): $*" | tee -a "$OUT/tp_$name.log"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$OUT/tp_$name.log"
    local rc=$?
    local took=$(($(date +%s) - start))
    case $rc in
        0) status[$name]="ok (${took} s)" ;;
        124 | 137) status[$name]="TIMED OUT after ${took} s" ;;
        *) status[$name]="FAILED rc=$rc (${took} s)" ;;
    esac
}

pytest_gpu=(python3 -m pytest -q -s -m gpu -p no:cacheprovider -o faulthandler_timeout=200)
for part in "${parts[@]}"; do
    case $part in
        nccl) run_part nccl 300 "${pytest_gpu[@]}" tests/gpu/test_tp_nccl.py ;;
        kill) run_part kill 300 "${pytest_gpu[@]}" tests/gpu/test_tp_worker_gpu.py ;;
        pool)
            run_part pool 330 python3 benchmarks/prefix_pool.py --preset h200 --workers 1,2 --partitions 16 \
                --num-pages 2000 --repeat "$POOL_REPEAT" --timeout-s 300 --out "$OUT/tp_pool.json"
            ;;
        atscale)
            # shellcheck disable=SC2086  # ATSCALE_SHAPE is a list of flags
            run_part atscale 330 python3 benchmarks/at_scale.py --preset llama-3.1-8b \
                --kv-cache-dtype fp8_e4m3 --quantization fp8 --variants queue,queue-tp2,queue-2w \
                --rounds "$ATSCALE_ROUNDS" --same-workers $ATSCALE_SHAPE --timeout-s 300 \
                --work-dir /tmp/tp_atscale --out "$OUT/tp_atscale.json"
            ;;
    esac
done

args=()
for part in "${parts[@]}"; do args+=("$part=${status[$part]}"); done
echo "tp_checks: $(($(date +%s) - began)) s in all" >> "$OUT/tp_checks.log"
python3 scripts/device/tp_table.py "$OUT" "${args[@]}" | tee "$OUT/tp_table.txt"
