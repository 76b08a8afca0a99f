"""FP8 against bf16 projections on the GPU: the decoder's four GEMM shapes of a model, per batch
of tokens, as the engine runs them (worker.models.fp8.Fp8Linear: activations quantized per
token by the fused kernel, torch._scaled_mm with row-wise scales) against ``F.linear`` in bf16.

Each row: GPU us per call (20 calls captured in one CUDA graph, as the engine's decode runs
them, rotating over 8 weight sets so the weights come from HBM, not L2; CUDA events around
each replay, median of 10), the weight bytes read per second and the TFLOP/s; ``quant`` times the per-token quantization kernel alone, ``fp8 mm`` the GEMM on
inputs already quantized (what the fused norm / SiLU-mul kernels hand over); ``tri mm`` and
``tri tma mm`` the same product by radixq's own Triton GEMM on every SM
(worker.kernels.bounded_gemm, per-thread and TMA loads), beside torch's.

    python benchmarks/fp8_gemm.py --model configs/llama-3.1-8b.json --tokens 64,256,1024,8192
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpu_timing import captured  # noqa: E402

from worker.kernels import ops  # noqa: E402
from worker.kernels.bounded_gemm import bounded_linear  # noqa: E402
from worker.models.fp8 import Fp8Linear  # noqa: E402

ROTATE = 8


def shapes(config: dict) -> dict[str, tuple[int, int]]:
    """name -> (in_features, out_features) of the decoder's projections."""
    hidden, heads, kv_heads = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    return {
        "qkv": (hidden, (heads + 2 * kv_heads) * head_dim),
        "o": (heads * head_dim, hidden),
        "gate_up": (hidden, 2 * inter),
        "down": (inter, hidden),
    }


def gpu_us(fn, calls: int = 20, reps: int = 10) -> float:
    """GPU time of one call, from a CUDA graph of ``calls`` calls (no host launch gaps)."""
    graph, _ = captured(lambda: [fn(i) for i in range(calls)])
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def bench(name: str, k: int, n: int, m: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(0)
    weights = [torch.randn(n, k, device="cuda", generator=gen).mul_(0.02).bfloat16() for _ in range(ROTATE)]
    layers = []
    for w in weights:
        linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        linear.weight.data.copy_(w)
        layers.append(Fp8Linear.from_linear(linear))
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    rows = ops.quantize_fp8_rows(x)
    flops = 2 * m * n * k
    row = {"shape": name, "m": m, "k": k, "n": n}
    with torch.inference_mode():
        row["bf16_us"] = gpu_us(lambda i: F.linear(x, weights[i % ROTATE]))
        row["fp8_us"] = gpu_us(lambda i: layers[i % ROTATE](x))
        row["fp8_mm_us"] = gpu_us(lambda i: layers[i % ROTATE](rows))
        row["quant_us"] = gpu_us(lambda i: ops.quantize_fp8_rows(x))
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        for key, tma in (("tri_mm_us", False), ("tri_tma_mm_us", True)):
            row[key] = gpu_us(
                lambda i, tma=tma: bounded_linear(
                    rows.data, layers[i % ROTATE].weight, programs=sms, tma=tma, x_scale=rows.scale,
                    w_scale=layers[i % ROTATE].weight_scale, out_dtype=torch.bfloat16,
                )
            )  # fmt: skip
    row["speedup"] = row["bf16_us"] / row["fp8_us"]
    row["speedup_mm"] = row["bf16_us"] / row["fp8_mm_us"]
    row["bf16_TBps"] = n * k * 2 / (row["bf16_us"] * 1e-6) / 1e12
    row["fp8_mm_TBps"] = n * k / (row["fp8_mm_us"] * 1e-6) / 1e12
    row["bf16_TFLOPs"] = flops / (row["bf16_us"] * 1e-6) / 1e12
    row["fp8_mm_TFLOPs"] = flops / (row["fp8_mm_us"] * 1e-6) / 1e12
    row["tri_tma_mm_TFLOPs"] = flops / (row["tri_tma_mm_us"] * 1e-6) / 1e12
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="configs/llama-3.1-8b.json", help="config.json (comma list)")
    parser.add_argument("--tokens", default="64,256,1024,8192", help="rows (tokens) per GEMM")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    for model in args.model.split(","):
        config = json.loads(Path(model).read_text())
        for m in (int(t) for t in args.tokens.split(",")):
            for name, (k, n) in shapes(config).items():
                row = {"model": Path(model).stem, **bench(name, k, n, m)}
                results.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    cols = ["model", "shape", "m", "bf16_us", "fp8_us", "fp8_mm_us", "tri_mm_us", "tri_tma_mm_us", "quant_us",
            "speedup", "speedup_mm", "bf16_TBps", "fp8_mm_TBps", "bf16_TFLOPs", "fp8_mm_TFLOPs",
            "tri_tma_mm_TFLOPs"]  # fmt: skip
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    for model in {r["model"] for r in results}:
        for m in sorted({r["m"] for r in results}):
            sel = [r for r in results if r["model"] == model and r["m"] == m]
            bf16, fp8 = sum(r["bf16_us"] for r in sel), sum(r["fp8_us"] for r in sel)
            print(
                f"{model} m={m}: a layer's four GEMMs bf16 {bf16:.1f} us, fp8 {fp8:.1f} us ({bf16 / fp8:.2f}x)"
            )


if __name__ == "__main__":
    main()
