"""Time FlashInferBackend plan() and forward() on the device (GPU only).

Decode: 256 requests of ~1000 tokens (eager and CUDA-graph replay); prefill: 8 fresh prompts
of 1024 tokens, and 4 chunks of 1024 tokens over 3072 cached ones. Per layer times are GPU
times (CUDA events around 28 consecutive layer calls over a pool of 4 layers, each layer's
KV far larger than L2); plan times are host wall times, device idle before each call.

    python benchmarks/attention_backend.py --out attention_backend.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from worker.attention.base import BatchLayout  # noqa: E402
from worker.attention.registry import create_backend  # noqa: E402
from worker.engine.kv_pool import KVPool  # noqa: E402

HEAD_DIM = 128
POOL_LAYERS = 4
MODEL_LAYERS = 28


def build(
    specs: list[tuple[int, int]],
    q_heads: int,
    kv_heads: int,
    page_size: int,
    use_tensor_cores: bool | None = None,
    seed: int = 0,
    cache_dtype: torch.dtype | None = None,
):
    """A FlashInfer backend over a random pool holding ``specs`` ((cached_len, extend_len) a
    request, each on random distinct pages), and the pass's pinned layout."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + e for c, e in specs]
    max_len = max(seq_lens) + page_size
    num_pages = sum(-(-n // page_size) for n in seq_lens) + 1
    kv = KVPool(POOL_LAYERS, num_pages, page_size, kv_heads, HEAD_DIM, torch.bfloat16, "cuda", cache_dtype)
    for layer in range(POOL_LAYERS):
        for pages in (kv.k_buffer(layer), kv.v_buffer(layer)):
            pages.copy_(torch.randn(pages.shape, device="cuda").to(pages.dtype))
    page_table = torch.zeros(len(specs) + 1, max_len, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=gen)
    used = 0
    for i, n in enumerate(seq_lens):
        pages = perm[used : used + -(-n // page_size)]
        used += len(pages)
        page_table[i, :n] = (
            (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n].to(torch.int32)
        )
    layout = BatchLayout(
        slots_cpu=torch.arange(len(specs), dtype=torch.int32).pin_memory(),
        cached_lens_cpu=torch.tensor([c for c, _ in specs], dtype=torch.int32).pin_memory(),
        extend_lens_cpu=torch.tensor([e for _, e in specs], dtype=torch.int32).pin_memory(),
    )
    backend = create_backend(
        "flashinfer",
        kv=kv,
        page_table=page_table.cuda(),
        model_config=SimpleNamespace(num_q_heads=q_heads),
        page_size=page_size,
        device="cuda",
        use_tensor_cores=use_tensor_cores,
    )
    return backend, layout


def host_median_us(fn, reps: int = 50) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def gpu_per_layer_us(fn, reps: int = 10) -> float:
    """Median over reps of (GPU time of MODEL_LAYERS calls) / MODEL_LAYERS."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / MODEL_LAYERS)
    return statistics.median(times)


def bench_decode(q_heads: int, kv_heads: int, page_size: int, use_tc: bool, graph: bool) -> dict:
    gen = torch.Generator().manual_seed(1)
    specs = [(int(n) - 1, 1) for n in torch.randint(900, 1101, (256,), generator=gen)]
    backend, layout = build(specs, q_heads, kv_heads, page_size, use_tensor_cores=use_tc)
    q = torch.randn(256, q_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    kv_bytes = int(layout.seq_lens_cpu.sum()) * kv_heads * HEAD_DIM * 2 * 2
    row = {"kind": "decode", "heads": f"{q_heads}/{kv_heads}", "page": page_size, "tc": use_tc}
    if not graph:
        meta = backend.plan(layout)

        def layers() -> None:
            for i in range(MODEL_LAYERS):
                backend.forward(q, i % POOL_LAYERS, meta)

        row["mode"] = "eager"
        row["plan_us"] = host_median_us(lambda: backend.plan(layout))
        row["launch_us_per_layer"] = host_median_us(layers, reps=10) / MODEL_LAYERS
    else:
        backend.init_cuda_graphs([256], max_seq_len=int(layout.seq_lens_cpu.max()))
        meta = backend.capture_meta(256)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            backend.forward(q, 0, meta)
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            for i in range(MODEL_LAYERS):
                backend.forward(q, i % POOL_LAYERS, meta)
        backend.plan_for_replay(layout, 256)

        def layers() -> None:
            cuda_graph.replay()

        row["mode"] = "graph"
        row["plan_us"] = host_median_us(lambda: backend.plan_for_replay(layout, 256))
    row["gpu_us_per_layer"] = gpu_per_layer_us(layers)
    row["kv_TBps"] = kv_bytes / (row["gpu_us_per_layer"] * 1e-6) / 1e12
    return row


def bench_prefill(
    q_heads: int, kv_heads: int, page_size: int, specs: list[tuple[int, int]], name: str
) -> dict:
    backend, layout = build(specs, q_heads, kv_heads, page_size)
    q = torch.randn(layout.num_tokens, q_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    meta = backend.plan(layout)

    def layers() -> None:
        for i in range(MODEL_LAYERS):
            backend.forward(q, i % POOL_LAYERS, meta)

    # causal FLOPs: 4 * heads * dim per (query, visible key) pair
    pairs = sum(e * c + e * (e + 1) // 2 for c, e in specs)
    row = {"kind": name, "heads": f"{q_heads}/{kv_heads}", "page": page_size, "tc": "-", "mode": "eager"}
    row["plan_us"] = host_median_us(lambda: backend.plan(layout))
    row["gpu_us_per_layer"] = gpu_per_layer_us(layers)
    row["TFLOPs"] = 4 * q_heads * HEAD_DIM * pairs / (row["gpu_us_per_layer"] * 1e-6) / 1e12
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="attention_backend.json")
    args = parser.parse_args()
    rows = []
    for q_heads, kv_heads in ((16, 8), (32, 8)):
        for page_size in (1, 16):
            for use_tc in (True, False):
                rows.append(bench_decode(q_heads, kv_heads, page_size, use_tc, graph=False))
                if q_heads == 16:
                    rows.append(bench_decode(q_heads, kv_heads, page_size, use_tc, graph=True))
            rows.append(bench_prefill(q_heads, kv_heads, page_size, [(0, 1024)] * 8, "prefill8x1024"))
            rows.append(bench_prefill(q_heads, kv_heads, page_size, [(3072, 1024)] * 4, "chunk4x1024+3072"))
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    cols = ["kind", "mode", "heads", "page", "tc", "plan_us", "gpu_us_per_layer", "kv_TBps", "TFLOPs"]
    print(" | ".join(cols))
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
