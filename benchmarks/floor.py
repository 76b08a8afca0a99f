"""The physical floor of the standard offline benchmark for a model config on one GPU.

Per decode step s the B_s running requests read every weight once (embedding rows aside)
and their whole KV cache, and do 2 * params * B_s matmul FLOPs plus attention FLOPs; a step
costs at least max(bytes / bandwidth, flops / peak). Prefill is counted as compute at peak
(its weight reads are amortised over thousands of tokens). Ceilings default to what was
measured on the H200 here: ~4.3 TB/s copy bandwidth and ~790 TFLOP/s dense bf16.

    python benchmarks/floor.py configs/qwen3-0.6b.json configs/qwen3-8b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline import standard_workload  # noqa: E402


def floor_seconds(config: dict, bandwidth: float, peak: float) -> dict[str, float]:
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    matmul_params = layers * per_layer + vocab * hidden  # the LM head (tied or not) is read every step
    weight_bytes = 2 * matmul_params
    kv_bytes_per_token = layers * 2 * kv_heads * head_dim * 2
    attn_flops_per_ctx = layers * 4 * heads * head_dim  # q.k and p.v per query token per context token
    w = standard_workload()
    prompts = [len(p) for p in w.prompts]
    prefill_flops = sum(2 * (layers * per_layer) * n + attn_flops_per_ctx * n * n / 2 for n in prompts)
    decode = kv_only = 0.0
    for s in range(max(w.max_tokens)):
        active = [(p, m) for p, m in zip(prompts, w.max_tokens, strict=True) if m > s]
        ctx = sum(p + s for p, _ in active)
        bytes_moved = weight_bytes + ctx * kv_bytes_per_token
        flops = 2 * matmul_params * len(active) + attn_flops_per_ctx * ctx
        decode += max(bytes_moved / bandwidth, flops / peak)
        kv_only += ctx * kv_bytes_per_token / bandwidth
    prefill = prefill_flops / peak
    return {"decode_s": decode, "prefill_s": prefill, "total_s": decode + prefill, "kv_only_s": kv_only,
            "weight_gb": weight_bytes / 1e9, "output_tokens": w.num_output_tokens}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--bandwidth", type=float, default=4.3e12)
    parser.add_argument("--peak", type=float, default=790e12)
    args = parser.parse_args()
    for path in args.configs:
        f = floor_seconds(json.loads(Path(path).read_text()), args.bandwidth, args.peak)
        print(
            f"{path}: floor {f['total_s']:.2f} s (decode {f['decode_s']:.2f}, prefill {f['prefill_s']:.2f}; "
            f"KV reads alone {f['kv_only_s']:.2f}; weights {f['weight_gb']:.1f} GB/step) "
            f"= {f['output_tokens'] / f['total_s']:.0f} tok/s at best"
        )


if __name__ == "__main__":
    main()
