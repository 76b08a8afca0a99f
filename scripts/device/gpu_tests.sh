#!/bin/bash
# The GPU tests on the device machine, from the repository root (carry .whl, .fi_cache, .redis):
#   bash scripts/device/gpu_tests.sh [PYTEST_ARGS...]
# Sources prelude.sh, prints the versions that matter, runs `pytest -m gpu tests/gpu` (plus any
# arguments) and writes the log to $OUT/gpu_tests.log (OUT defaults to /tmp/out).
#
# With no arguments on a machine of two or more GPUs it shards: the one-GPU test files are dealt
# round-robin (sorted by name) to one pytest per GPU (CUDA_VISIBLE_DEVICES), run at once, each
# logging to $OUT/gpu_tests.N.log; then the files that need two GPUs (TWO_GPU_FILES) run on all of
# them. SHARD_TIMEOUT_S (default 420) and TWO_GPU_TIMEOUT_S (default 240) bound each stage, so a
# device call with a hard limit still returns its logs.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source scripts/device/prelude.sh || exit 1
TWO_GPU_FILES="tests/gpu/test_tp_nccl.py tests/gpu/test_tp_worker_gpu.py"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import torch, flashinfer, triton; print('torch', torch.__version__, 'flashinfer', \
flashinfer.__version__, 'triton', triton.__version__)"
} 2>&1 | tee "$OUT/gpu_tests.log"

if [ "$#" -gt 0 ] || [ "$gpus" -lt 2 ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu "$@" 2>&1 | tee -a "$OUT/gpu_tests.log"
    exit $?
fi

mapfile -t files < <(ls tests/gpu/test_*.py | sort)
declare -a shards pids
i=0
for f in "${files[@]}"; do
    case " $TWO_GPU_FILES " in *" $f "*) continue ;; esac
    shards[$((i % gpus))]+="$f "
    i=$((i + 1))
done
for ((g = 0; g < gpus; g++)); do
    [ -n "${shards[$g]}" ] || continue
    echo "shard $g (GPU $g): ${shards[$g]}" | tee -a "$OUT/gpu_tests.log"
    # shellcheck disable=SC2086
    CUDA_VISIBLE_DEVICES=$g timeout -k 10 "${SHARD_TIMEOUT_S:-420}" \
        python3 -m pytest -q -m gpu -p no:cacheprovider ${shards[$g]} > "$OUT/gpu_tests.$g.log" 2>&1 &
    pids[$g]=$!
done
rc=0
for ((g = 0; g < gpus; g++)); do
    [ -n "${pids[$g]}" ] || continue
    wait "${pids[$g]}"
    status=$?
    [ "$status" -eq 0 ] || rc=$status
    echo "shard $g: exit $status; $(tail -n 1 "$OUT/gpu_tests.$g.log")" | tee -a "$OUT/gpu_tests.log"
done
# shellcheck disable=SC2086
timeout -k 10 "${TWO_GPU_TIMEOUT_S:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider $TWO_GPU_FILES \
    2>&1 | tee -a "$OUT/gpu_tests.log"
status=$?
[ "$status" -eq 0 ] || rc=$status
exit $rc
