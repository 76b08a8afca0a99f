"""Time FlashInferBackend plan() and forward() on the device (GPU only).

Decode: B requests of about L tokens (``--batches 256x1000,1024x1500``), per KV dtype (bf16,
fp8 e4m3), head layout (16/8: Qwen3-0.6B, 32/8: Llama-3.1-8B) and decode kernel (FlashInfer FA2
on tensor cores ``tc`` or CUDA cores ``cc``, XQA ``xqa``), eager and CUDA-graph replay; each row
gives the KV bytes read per second (against ~4.3 TB/s) and the output's relative error against
dense float32 attention on the same pages (a wrong kernel choice shows there first). Prefill: 8
fresh prompts of 1024 tokens, and 4 chunks of 1024 tokens over 3072 cached ones. Per layer
times are GPU times (CUDA events around 28 consecutive layer calls over a pool of 4 layers,
each layer's KV far larger than L2); plan times are host wall times, device idle before each
call.

    python benchmarks/attention_backend.py --out attention_backend.json            # decode + prefill
    python benchmarks/attention_backend.py --kv fp8 --kernels tc,cc,xqa --no-prefill
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_timing import captured, event_ms  # noqa: E402

from worker.attention.registry import create_backend  # noqa: E402
from worker.forward import BatchLayout  # noqa: E402
from worker.kvcache.pool import KVPool  # noqa: E402
from worker.models.config import LayerAttention  # noqa: E402

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
    decode_kernel: str = "auto",
    head_dim: int = HEAD_DIM,
    attention: LayerAttention | None = None,
    backend_name: str = "flashinfer",
    device: str = "cuda",
    ragged_backend: str | None = None,
):
    """A FlashInfer backend (or ``backend_name``'s, on ``device``) over a random pool holding
    ``specs`` ((cached_len, extend_len) a request, each on random distinct pages), and the
    pass's layout (pinned on CUDA); every layer attends as ``attention`` (default: plain
    causal attention)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + e for c, e in specs]
    max_len = max(seq_lens) + page_size
    num_pages = sum(-(-n // page_size) for n in seq_lens) + 1
    kv = KVPool(POOL_LAYERS, num_pages, page_size, kv_heads, head_dim, torch.bfloat16, device, cache_dtype)
    for layer in range(POOL_LAYERS):
        for pages in (kv.k_buffer(layer), kv.v_buffer(layer)):
            for chunk in pages.split(max(1, pages.shape[0] // 16)):  # NOTE: no fp32 copy of all of it
                chunk.copy_(torch.randn(chunk.shape, device=device).to(pages.dtype))
    page_table = torch.zeros(len(specs) + 1, max_len, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=gen)
    used = 0
    for i, n in enumerate(seq_lens):
        pages = perm[used : used + -(-n // page_size)]
        used += len(pages)
        page_table[i, :n] = (
            (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n].to(torch.int32)
        )
    pin = (lambda t: t.pin_memory()) if device == "cuda" else (lambda t: t)
    layout = BatchLayout(
        slots_cpu=pin(torch.arange(len(specs), dtype=torch.int32)),
        cached_lens_cpu=pin(torch.tensor([c for c, _ in specs], dtype=torch.int32)),
        extend_lens_cpu=pin(torch.tensor([e for _, e in specs], dtype=torch.int32)),
    )
    options = (
        dict(use_tensor_cores=use_tensor_cores, decode_kernel=decode_kernel, ragged_backend=ragged_backend)
        if backend_name == "flashinfer"
        else {}
    )
    backend = create_backend(
        backend_name,
        kv=kv,
        page_table=page_table.to(device),
        model_config=SimpleNamespace(
            num_q_heads=q_heads,
            head_dim=head_dim,
            layer_attention=(attention,) * POOL_LAYERS if attention else (),
        ),
        page_size=page_size,
        device=device,
        **options,
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
        times.append(event_ms(fn) * 1e3 / MODEL_LAYERS)
    return statistics.median(times)


KERNELS = {"tc": ("fa2", True), "cc": ("fa2", False), "xqa": ("xqa", None)}


def dense_error(backend, layout: BatchLayout, q: torch.Tensor, out: torch.Tensor, rows: int = 4) -> float:
    """‖out - dense float32 attention‖ / ‖dense‖ over the first ``rows`` requests (layer 0)."""
    kv = backend.kv
    group = q.shape[1] // kv.num_kv_heads
    errs, norms = 0.0, 0.0
    for i in range(rows):
        n = int(layout.seq_lens_cpu[i])
        locs = backend.page_table[int(layout.slots_cpu[i]), :n].long()
        k, v = (t.float().repeat_interleave(group, dim=1) for t in kv.gather(0, locs))
        scores = torch.einsum("hd,shd->hs", q[i].float(), k) / HEAD_DIM**0.5
        ref = torch.einsum("hs,shd->hd", scores.softmax(-1), v)
        errs += float((out[i].float() - ref).norm() ** 2)
        norms += float(ref.norm() ** 2)
    return (errs / norms) ** 0.5


def bench_decode(
    q_heads: int, kv_heads: int, page_size: int, kernel: str, graph: bool,
    batch: int = 256, length: int = 1000, kv_dtype: str = "bf16",
) -> dict:  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    spread = max(1, length // 10)
    specs = [
        (int(n) - 1, 1) for n in torch.randint(length - spread, length + spread + 1, (batch,), generator=gen)
    ]
    cache_dtype = torch.float8_e4m3fn if kv_dtype == "fp8" else None
    decode_kernel, use_tc = KERNELS[kernel]
    backend, layout = build(
        specs, q_heads, kv_heads, page_size, use_tensor_cores=use_tc, cache_dtype=cache_dtype,
        decode_kernel=decode_kernel,
    )  # fmt: skip
    q = torch.randn(batch, q_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    itemsize = 1 if kv_dtype == "fp8" else 2
    kv_bytes = int(layout.seq_lens_cpu.sum()) * kv_heads * HEAD_DIM * 2 * itemsize
    row = {
        "kind": "decode", "kv": kv_dtype, "heads": f"{q_heads}/{kv_heads}", "page": page_size,
        "kernel": kernel, "batch": f"{batch}x{length}",
    }  # fmt: skip
    if not graph:
        meta = backend.plan(layout)
        row["rel_err"] = dense_error(backend, layout, q, backend.forward(q, 0, meta))

        def layers() -> None:
            for i in range(MODEL_LAYERS):
                backend.forward(q, i % POOL_LAYERS, meta)

        row["mode"] = "eager"
        row["plan_us"] = host_median_us(lambda: backend.plan(layout))
        row["launch_us_per_layer"] = host_median_us(layers, reps=10) / MODEL_LAYERS
    else:
        backend.init_cuda_graphs([batch], max_seq_len=int(layout.seq_lens_cpu.max()))
        meta = backend.capture_meta(batch)
        cuda_graph, outs = captured(
            lambda: [backend.forward(q, i % POOL_LAYERS, meta) for i in range(MODEL_LAYERS)]
        )
        backend.plan_for_replay(layout, batch)
        cuda_graph.replay()
        row["rel_err"] = dense_error(backend, layout, q, outs[0])

        def layers() -> None:
            cuda_graph.replay()

        row["mode"] = "graph"
        row["plan_us"] = host_median_us(lambda: backend.plan_for_replay(layout, batch))
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
    row = {"kind": name, "heads": f"{q_heads}/{kv_heads}", "page": page_size, "mode": "eager"}
    row["plan_us"] = host_median_us(lambda: backend.plan(layout))
    row["gpu_us_per_layer"] = gpu_per_layer_us(layers)
    row["TFLOPs"] = 4 * q_heads * HEAD_DIM * pairs / (row["gpu_us_per_layer"] * 1e-6) / 1e12
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="attention_backend.json")
    parser.add_argument("--kv", default="bf16,fp8", help="KV page dtypes: bf16, fp8")
    parser.add_argument("--heads", default="16/8,32/8", help="q/kv head counts")
    parser.add_argument("--kernels", default="tc,cc,xqa", help=f"decode kernels: {sorted(KERNELS)}")
    parser.add_argument("--batches", default="256x1000", help="decode shapes, requests x tokens")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--no-eager", action="store_true", help="decode: CUDA-graph replay only")
    parser.add_argument("--no-prefill", action="store_true")
    args = parser.parse_args()
    rows = []
    for heads in args.heads.split(","):
        q_heads, kv_heads = (int(h) for h in heads.split("/"))
        for shape in args.batches.split(","):
            batch, length = (int(x) for x in shape.split("x"))
            for kv_dtype in args.kv.split(","):
                for kernel in args.kernels.split(","):
                    for graph in (False, True) if not args.no_eager else (True,):
                        try:
                            rows.append(
                                bench_decode(
                                    q_heads, kv_heads, args.page_size, kernel, graph, batch, length, kv_dtype
                                )
                            )
                        except Exception as exc:  # noqa: BLE001  # NOTE: one failing kernel must not hide the rest
                            rows.append({"kind": "decode", "kv": kv_dtype, "heads": heads, "kernel": kernel,
                                         "batch": shape, "mode": "graph" if graph else "eager",
                                         "error": f"{type(exc).__name__}: {str(exc)[:160]}"})  # fmt: skip
                        print(json.dumps(rows[-1]), flush=True)
                        torch.cuda.empty_cache()
        if not args.no_prefill:
            page_size = args.page_size
            rows.append(bench_prefill(q_heads, kv_heads, page_size, [(0, 1024)] * 8, "prefill8x1024"))
            rows.append(bench_prefill(q_heads, kv_heads, page_size, [(3072, 1024)] * 4, "chunk4x1024+3072"))
            print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    cols = [
        "kind",
        "mode",
        "kv",
        "heads",
        "batch",
        "kernel",
        "plan_us",
        "gpu_us_per_layer",
        "kv_TBps",
        "rel_err",
        "TFLOPs",
        "error",
    ]
    print(" | ".join(cols))
    for r in rows:
        cells = [f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
