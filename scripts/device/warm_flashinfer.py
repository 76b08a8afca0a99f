"""Build (or load from ~/.cache/flashinfer) every FlashInfer module radixq uses, and time it.

bf16, head_dim 128, q/kv heads 16/8 and 32/8, page sizes 1 and 16: ragged prefill (fa2),
decode on tensor cores (the same fa2 prefill module) and decode on CUDA cores.

    python scripts/device/warm_flashinfer.py
"""

from __future__ import annotations

import time

import torch
from bench_flashinfer import HEAD_DIM, build  # same directory, first on sys.path

from worker.attention.registry import create_backend


def main() -> None:
    t0 = time.perf_counter()
    for q_heads, kv_heads in ((16, 8), (32, 8)):
        for page_size in (1, 16):
            for use_tc in (True, False):
                for specs in ([(5, 1), (40, 1)], [(0, 20), (17, 3)]):
                    kv, page_table, layout, config = build(specs, q_heads, kv_heads, page_size)
                    backend = create_backend(
                        "flashinfer",
                        kv=kv,
                        page_table=page_table,
                        model_config=config,
                        page_size=page_size,
                        device="cuda",
                        use_tensor_cores=use_tc,
                    )
                    q = torch.randn(layout.num_tokens, q_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
                    backend.forward(q, 0, backend.plan(layout))
                    torch.cuda.synchronize()
                    print(
                        f"warm {q_heads}/{kv_heads} page {page_size} tc {use_tc} specs {specs}: "
                        f"{time.perf_counter() - t0:.1f} s",
                        flush=True,
                    )
    print(f"warm total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
