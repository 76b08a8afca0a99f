#!/bin/bash
# What a device command carries besides the tree, fetched on this (networked) machine, from the
# repository root:
#   bash scripts/device/fetch_deps.sh
# writes .whl/ (cp312 manylinux wheels of what the device image lacks: FlashInfer and its
# tvm-ffi, the queue's client libraries, gguf, xgrammar, pydantic, cuda-python's driver
# bindings; 29 MB) and .redis/root/ (redis-server and redis-cli from Debian packages, with the
# two libraries an Ubuntu image may lack). Both folders are git-ignored; scripts/device/prelude.sh
# installs them there. The FlashInfer JIT cache (.fi_cache/) is built on the device:
# scripts/device/warm_flashinfer.py.
set -euo pipefail
cd "$(dirname "$0")/../.."

WHEELS=(
    flashinfer-python==0.6.6 apache-tvm-ffi==0.1.15.post2
    msgspec pyzmq redis fakeredis gguf
    xgrammar==0.2.9 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection
    typing-extensions
    cuda-bindings==13.0.3 cuda-pathfinder  # the driver API (green contexts) for overlap_probe --split-sms
)
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"

mkdir -p .redis/debs .redis/root
(cd .redis/debs && apt-get download -q redis-server redis-tools libjemalloc2 liblzf1 >/dev/null)
for deb in .redis/debs/*.deb; do dpkg -x "$deb" .redis/root; done
# what travels counts toward the device's 64 MiB: keep the server, the client and their libraries
rm -rf .redis/debs .redis/root/usr/share .redis/root/etc .redis/root/usr/bin/redis-benchmark     .redis/root/usr/bin/redis-check-aof .redis/root/lib
du -sh .whl .redis
