# Source at the start of every device command, from the repository root:
#   source scripts/device/prelude.sh || exit 1
# with carry: [".whl", ".fi_cache", ".redis"] (gpu_tests.sh and bench.sh do it for you). It
#   1. installs the carried cp312 wheels (.whl/: flashinfer-python, apache-tvm-ffi and the other
#      dependencies the device image lacks) into /tmp/site and puts it and the repo on PYTHONPATH;
#   2. unpacks the FlashInfer modules built before (.fi_cache/flashinfer_cache.tgz, written by
#      scripts/device/warm_flashinfer.py --pack: NAME/NAME.so each) into the installed package's
#      AOT folder (flashinfer/data/aot), which FlashInfer loads without compiling; a module not
#      there is compiled on first use (about 40-60 s each);
#   3. puts redis-server / redis-cli (Debian binaries from .redis/root) on PATH through wrappers that
#      set LD_LIBRARY_PATH for redis alone (never for Python).
_RADIXQ_ROOT=$(pwd)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$_RADIXQ_ROOT"/.whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$_RADIXQ_ROOT${PYTHONPATH:+:$PYTHONPATH}
find /tmp/site -exec touch -h -d @946684800 {} +

if [ -f "$_RADIXQ_ROOT/.fi_cache/flashinfer_cache.tgz" ]; then
    mkdir -p /tmp/site/flashinfer/data/aot
    tar -xzf "$_RADIXQ_ROOT/.fi_cache/flashinfer_cache.tgz" -C /tmp/site/flashinfer/data/aot || return 1
    echo "prelude: $(find /tmp/site/flashinfer/data/aot -name '*.so' | wc -l) prebuilt FlashInfer modules"
fi

if [ -x "$_RADIXQ_ROOT/.redis/root/usr/bin/redis-server" ] && ! command -v redis-server >/dev/null; then
    mkdir -p /tmp/redis-bin
    for _bin in redis-server redis-cli; do
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/.redis/root/usr/lib/x86_64-linux-gnu exec %s/.redis/root/usr/bin/%s "$@"\n' \
            "$_RADIXQ_ROOT" "$_RADIXQ_ROOT" "$_bin" > /tmp/redis-bin/$_bin
        chmod +x /tmp/redis-bin/$_bin
    done
    export PATH=/tmp/redis-bin:$PATH
fi
command -v redis-server >/dev/null && echo "prelude: $(redis-server --version | cut -c1-40)"
true
