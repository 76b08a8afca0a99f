"""Does a decode step's attention overlap its GEMMs when the batch is cut in two? (issue 31
item 2: the measured plan before any nano-batch path is built)

One decode step of a model config, with dummy weights: per layer the QKV projection, attention
over B requests of about L cached tokens (the attention backend's kernels on its paged KV, bf16
or FP8 pages), the O projection, gate/up, SiLU-mul and down, each layer's output feeding the
next (norms, RoPE, residuals and the LM head left out: the same in every variant). Captured in
CUDA graphs and timed four ways, interleaved, median of ``--reps`` replays:

    whole     every layer over all B rows (today's step)
    halves    two nano-batches of B/2, one after the other on one stream
    overlap   the same two nano-batches on two streams of one graph (fork, join), each its own
              chain of layers: one's attention may run beside the other's GEMMs
    attention / gemms   the whole batch's attention alone, its GEMMs alone

``overlap`` below ``whole`` is what nano-batching could gain on that shape; at best it reaches
max(attention, gemms). The two halves read distinct KV pools and weights of the same shapes
(so nothing is shared between the streams but the GPU).

    python benchmarks/overlap_probe.py                                      # Qwen3-0.6B, 256 x 850, bf16 and FP8 KV
    python benchmarks/overlap_probe.py --model configs/llama-3.1-8b.json --batch 1024 --length 1500 --kv fp8
    python benchmarks/overlap_probe.py --device cpu --attention torch --layers 2 --batch 4 --length 40 --hidden 64  # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from attention_backend import POOL_LAYERS, build  # noqa: E402
from gpu_timing import event_ms  # noqa: E402
from model_shape import ModelShape  # noqa: E402

VARIANTS = ("whole", "halves", "overlap", "attention", "gemms")


@dataclass
class Half:
    """One nano-batch (or the whole batch): its attention backend and pass metadata, its rows'
    activations, and every layer's projection weights."""

    backend: object
    layout: object
    meta: object
    x: torch.Tensor  # [rows, hidden]
    layers: list[dict[str, torch.Tensor]]


def weights(shape: ModelShape, layers: int, device: str, seed: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(seed)
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(torch.bfloat16)

    return [
        {"qkv": w(q + 2 * kv, shape.hidden), "o": w(shape.hidden, q),
         "gate_up": w(2 * shape.intermediate, shape.hidden), "down": w(shape.hidden, shape.intermediate)}
        for _ in range(layers)
    ]  # fmt: skip


def half(args: argparse.Namespace, shape: ModelShape, rows: int, seed: int) -> Half:
    gen = torch.Generator().manual_seed(seed)
    spread = max(1, args.length // 10)
    lens = torch.randint(args.length - spread, args.length + spread + 1, (rows,), generator=gen)
    cache_dtype = torch.float8_e4m3fn if args.kv == "fp8" else None
    backend, layout = build(
        [(int(n) - 1, 1) for n in lens], shape.heads, shape.kv_heads, args.page_size, seed=seed,
        cache_dtype=cache_dtype, head_dim=shape.head_dim, backend_name=args.attention, device=args.device,
    )  # fmt: skip
    x = torch.randn(rows, shape.hidden, device=args.device).to(torch.bfloat16)
    return Half(backend, layout, None, x, weights(shape, args.layers, args.device, seed))


def step(h: Half, shape: ModelShape, attention: bool = True, gemms: bool = True) -> torch.Tensor:
    """The layers' chain over one nano-batch (module docstring); either part alone when asked."""
    x = h.x
    rows, q_dim = x.shape[0], shape.heads * shape.head_dim
    q = torch.zeros(rows, shape.heads, shape.head_dim, dtype=x.dtype, device=x.device)
    for i, w in enumerate(h.layers):
        if gemms:
            qkv = torch.nn.functional.linear(x, w["qkv"])
            q = qkv[:, :q_dim].reshape(rows, shape.heads, shape.head_dim)
        if attention:
            q = h.backend.forward(q.contiguous(), i % POOL_LAYERS, h.meta).reshape(rows, shape.heads, -1)
        if gemms:
            x = torch.nn.functional.linear(q.reshape(rows, q_dim), w["o"])
            gate, up = torch.nn.functional.linear(x, w["gate_up"]).chunk(2, dim=-1)
            x = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w["down"])
    return x


def graphed(h_list: list[Half], run: Callable[[], object]) -> Callable[[], None]:
    """A CUDA graph of ``run`` (after a warm-up on a side stream), replayed after each backend's
    replay plan; on CPU, ``run`` itself."""
    if not torch.cuda.is_available():

        def eager() -> None:
            run()

        return eager
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        run()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    def replay() -> None:
        for h in h_list:
            h.backend.plan_for_replay(h.layout, h.x.shape[0])
        graph.replay()

    return replay


def two_streams(
    a: Callable[[], object], b: Callable[[], object], side: torch.cuda.Stream | None
) -> Callable[[], None]:
    """``a`` on the current stream and ``b`` on ``side``, forked and joined (inside a capture too)."""

    def run() -> None:
        if side is None:
            a(), b()
            return
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b()
        a()
        main.wait_stream(side)

    return run


def prepare(h: Half) -> None:
    """Graph-mode metadata for this nano-batch's size (CUDA), or an eager plan (CPU)."""
    rows = h.x.shape[0]
    if torch.cuda.is_available():
        h.backend.init_cuda_graphs([rows], max_seq_len=int(h.layout.seq_lens_cpu.max()))
        h.meta = h.backend.capture_meta(rows)
        h.backend.plan_for_replay(h.layout, rows)
    else:
        h.meta = h.backend.plan(h.layout)


def probe(args: argparse.Namespace, shape: ModelShape) -> dict:
    """Median ms per step of each variant (module docstring) for one KV dtype."""
    whole = half(args, shape, args.batch, 1)
    a, b = half(args, shape, args.batch // 2, 2), half(args, shape, args.batch // 2, 3)
    for h in (whole, a, b):
        prepare(h)
    side = torch.cuda.Stream() if torch.cuda.is_available() else None
    runs = {
        "whole": graphed([whole], lambda: step(whole, shape)),
        "halves": graphed([a, b], lambda: (step(a, shape), step(b, shape))),
        "overlap": graphed([a, b], two_streams(lambda: step(a, shape), lambda: step(b, shape), side)),
        "attention": graphed([whole], lambda: step(whole, shape, gemms=False)),
        "gemms": graphed([whole], lambda: step(whole, shape, attention=False)),
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.reps):  # interleaved
        for name, fn in runs.items():
            times[name].append(event_ms(fn))
    row = {"kv": args.kv, "batch": args.batch, "length": args.length, "layers": args.layers}
    row.update({f"{name}_ms": statistics.median(t) for name, t in times.items()})
    row["overlap_vs_whole"] = row["overlap_ms"] / row["whole_ms"]
    row["best_possible_ms"] = max(row["attention_ms"], row["gemms_ms"])
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="configs/qwen3-0.6b.json", help="a config.json (its shape only)")
    parser.add_argument("--batch", type=int, default=256, help="requests decoding (cut in two halves)")
    parser.add_argument("--length", type=int, default=850, help="cached tokens per request, about")
    parser.add_argument("--kv", default="bf16,fp8", help="comma list: bf16, fp8")
    parser.add_argument("--layers", type=int, default=None, help="layers (default: the model's)")
    parser.add_argument(
        "--hidden", type=int, default=None, help="override hidden and intermediate/3 (smoke runs)"
    )
    parser.add_argument("--attention", default="flashinfer", help="attention backend: flashinfer, torch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    shape = ModelShape.from_config(json.loads(Path(args.model).read_text()))
    if args.hidden:
        shape = replace(shape, hidden=args.hidden, intermediate=3 * args.hidden)
    args.layers = args.layers or shape.layers
    rows = []
    for kv in args.kv.split(","):
        row = probe(argparse.Namespace(**{**vars(args), "kv": kv}), shape)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{args.model}: one decode step, {args.layers} layers, {args.batch} x ~{args.length} tokens")
    print("| KV | whole ms | halves ms | overlap ms | attention ms | GEMMs ms | overlap / whole |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['kv']} | {r['whole_ms']:.3f} | {r['halves_ms']:.3f} | {r['overlap_ms']:.3f} | "
              f"{r['attention_ms']:.3f} | {r['gemms_ms']:.3f} | {r['overlap_vs_whole']:.3f} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
