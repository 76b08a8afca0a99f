#!/bin/bash
# Stage-1 device run (carry: .whl .redis): versions, FlashInfer JIT build + cache into $OUT,
# the FlashInfer GPU tests, plan/forward timings, and a check that the cache loads after a
# fresh install of the wheels. Run from the repository root:
#   bash scripts/device/stage1_flashinfer.sh
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

main() {
    source scripts/device/prelude.sh || return 1
    nvidia-smi
    python3 -c "import torch, flashinfer, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'flashinfer', flashinfer.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    redis-server --port 16390 --save '' --appendonly no --daemonize yes && sleep 0.5 \
        && redis-cli -p 16390 ping && redis-cli -p 16390 shutdown nosave
    echo "== JIT build"
    time python3 scripts/device/warm_flashinfer.py || return 1
    du -sh ~/.cache/flashinfer
    tar -czf /tmp/flashinfer_cache.tgz -C ~/.cache flashinfer && ls -la /tmp/flashinfer_cache.tgz
    split -b 15M -d -a 1 /tmp/flashinfer_cache.tgz "$OUT/flashinfer_cache.tgz.part"
    echo "== GPU tests"
    timeout 150 python3 -m pytest tests/gpu/test_flashinfer_backend.py -m gpu -o addopts="" -ra -q \
        -p no:cacheprovider --timeout 140
    echo "== timings"
    timeout 90 python3 scripts/device/bench_flashinfer.py --out "$OUT/bench.json"
    echo "== cache reload after a fresh install"
    rm -rf ~/.cache/flashinfer && mkdir -p .fi_cache && cp /tmp/flashinfer_cache.tgz .fi_cache/
    source scripts/device/prelude.sh || return 1
    time timeout 60 python3 scripts/device/warm_flashinfer.py
}

main 2>&1 | tee "$OUT/log.txt"
