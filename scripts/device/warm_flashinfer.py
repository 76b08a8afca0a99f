"""Build (or load from ~/.cache/flashinfer) every FlashInfer module radixq uses, and time it.

bf16 queries over bf16 and FP8 (e4m3) KV pages, head_dim 128, q/kv heads 16/8 and 32/8, page
sizes 1 and 16: ragged prefill (fa2), decode on tensor cores (the same fa2 prefill module) and
decode on CUDA cores. With
``--pack DIR`` it then writes the cache as DIR/flashinfer_cache.tgz.part00, part01, ... (15 MiB
each); ``cat`` them, in name order, into .fi_cache/flashinfer_cache.tgz, which
scripts/device/prelude.sh unpacks.

    source scripts/device/prelude.sh && python3 scripts/device/warm_flashinfer.py --pack $OUT
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import torch  # noqa: E402
from attention_backend import HEAD_DIM, build  # noqa: E402

PART_BYTES = 15 * 2**20


def warm() -> None:
    t0 = time.perf_counter()
    shapes = [
        (h, p, tc, c)
        for h in ((16, 8), (32, 8))
        for p in (1, 16)
        for tc in (True, False)
        for c in (None, torch.float8_e4m3fn)
    ]
    for (q_heads, kv_heads), page_size, use_tc, cache_dtype in shapes:
        for specs in ([(5, 1), (40, 1)], [(0, 20), (17, 3)]):
            backend, layout = build(
                specs, q_heads, kv_heads, page_size, use_tensor_cores=use_tc, cache_dtype=cache_dtype
            )
            q = torch.randn(layout.num_tokens, q_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            backend.forward(q, 0, backend.plan(layout))
            torch.cuda.synchronize()
            print(
                f"warm {q_heads}/{kv_heads} page {page_size} tc {use_tc} kv {cache_dtype or 'bf16'} "
                f"specs {specs}: {time.perf_counter() - t0:.1f} s",
                flush=True,
            )
    print(f"warm total {time.perf_counter() - t0:.1f} s")


def pack(out_dir: Path) -> None:
    """~/.cache/flashinfer as a gzipped tar, in parts of PART_BYTES."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(Path.home() / ".cache" / "flashinfer", arcname="flashinfer")
    data = buffer.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, start in enumerate(range(0, len(data), PART_BYTES)):
        (out_dir / f"flashinfer_cache.tgz.part{index:02d}").write_bytes(data[start : start + PART_BYTES])
    print(f"packed {len(data) / 2**20:.1f} MiB into {out_dir}/flashinfer_cache.tgz.part*")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pack", type=Path, default=None, help="write the cache archive's parts here")
    args = parser.parse_args()
    warm()
    if args.pack is not None:
        pack(args.pack)


if __name__ == "__main__":
    main()
