#!/bin/bash
# One benchmark on the device machine, from the repository root (carry .whl, .fi_cache, .redis):
#   bash scripts/device/bench.sh NAME [ARGS...]       # runs python benchmarks/NAME.py ARGS...
# e.g. `bash scripts/device/bench.sh offline --repeat 3 --out $OUT/bench.json`. Sources
# prelude.sh and writes the log to $OUT/NAME.log (OUT defaults to /tmp/out); environment
# variables pass through.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
name=${1:?usage: bash scripts/device/bench.sh NAME [ARGS...] (a file benchmarks/NAME.py)}
shift
[ -f "benchmarks/$name.py" ] || { echo "bench.sh: no benchmarks/$name.py" >&2; exit 2; }
source scripts/device/prelude.sh || exit 1
python3 "benchmarks/$name.py" "$@" 2>&1 | tee "$OUT/$name.log"
