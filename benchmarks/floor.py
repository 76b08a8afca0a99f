"""The physical floor of a workload shape for a model config on one GPU.

Decode: requests run under an ideal continuous-batching scheduler (at most ``max_running``
at once, and, when a KV capacity is given, only as many as fit with their whole final
length reserved: it never retracts). A request with ``m`` output tokens takes ``m`` decode
steps, reading ``prompt_len + s`` context tokens at its step ``s``. Per step the B running
requests read every weight once (the LM head included, embedding rows aside) and their live
KV, and do ``2 * params * B`` matmul FLOPs plus attention FLOPs; a step costs at least
max(bytes / bandwidth, flops / peak). Prefill is counted as compute at peak (its weight
reads are amortised over thousands of tokens). FP8 KV (``kv_bytes`` 1) halves the KV bytes;
FP8 weights (``fp8_weights``: the decoder's projections in e4m3, the LM head in bf16) halve
their bytes and run their FLOPs at twice the bf16 peak. Ceilings default to what was measured
on the H200 here: ~4.3 TB/s copy bandwidth and ~790 TFLOP/s dense bf16 (FP8: 2x, the
datasheet's ratio; not measured).

``memory_s + prefill_s`` (weights x steps + KV reads + prefill FLOPs, each at its ceiling) is
the floor whenever every decode step is bandwidth-bound; ``total_s`` takes the per-step max,
so it is never below it (``compute_bound_steps`` says how many steps were not). A scheduler
that mixes prefill into bandwidth-bound decode steps can hide prefill FLOPs under KV reads;
``overlap_s`` = max(all bytes / bandwidth, all FLOPs / peak) is the bound even then.

    python benchmarks/floor.py configs/qwen3-0.6b.json configs/qwen3-8b.json     # standard workload
    python benchmarks/floor.py --preset llama-3.1-8b --kv-cache-dtype fp8_e4m3     # at-scale shape
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline import standard_workload  # noqa: E402

H200_BANDWIDTH = 4.3e12  # bytes/s
H200_PEAK = 790e12  # dense bf16 FLOP/s
KV_BYTES = {"auto": 2, "bf16": 2, "fp8_e4m3": 1}  # bytes per KV element ("auto": the bf16 model dtype)


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        heads = config["num_attention_heads"]
        return cls(
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            heads=heads,
            kv_heads=config["num_key_value_heads"],
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate=config["intermediate_size"],
            vocab=config["vocab_size"],
        )

    @property
    def body_params(self) -> int:
        """Matmul weights of the decoder layers: q/k/v, o, gate/up/down."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return self.layers * (qkv + o + 3 * self.hidden * self.intermediate)

    @property
    def matmul_params(self) -> int:
        """What a decode step reads: the layers and the LM head (tied or not)."""
        return self.body_params + self.vocab * self.hidden

    @property
    def kv_elements_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim

    @property
    def attn_flops_per_context_token(self) -> int:
        """q.k and p.v FLOPs of one query token against one context token, all layers."""
        return self.layers * 4 * self.heads * self.head_dim


def decode_steps(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_running: int,
    kv_capacity_tokens: int | None = None,
) -> list[tuple[int, int]]:
    """(running requests, live context tokens) of every decode step, admitting in order."""
    if max_running < 1:
        raise ValueError(f"max_running={max_running}: must be >= 1")
    steps: list[tuple[int, int]] = []
    running: list[tuple[int, int]] = []  # heap of (step after its last, request index)
    step = context = reserved = admitted = 0
    n = len(prompt_lens)
    while admitted < n or running:
        while admitted < n and len(running) < max_running:
            p, m = prompt_lens[admitted], output_lens[admitted]
            if kv_capacity_tokens is not None and reserved + p + m > kv_capacity_tokens:
                if not running:
                    raise ValueError(f"request {admitted} ({p} + {m} tokens) exceeds the KV capacity")
                break
            admitted += 1
            if m > 0:
                heapq.heappush(running, (step + m, admitted - 1))
                context += p
                reserved += p + m
        steps.append((len(running), context))
        step += 1
        context += len(running)  # every running request's context grows by its new token
        while running and running[0][0] == step:
            _, i = heapq.heappop(running)
            context -= prompt_lens[i] + output_lens[i]
            reserved -= prompt_lens[i] + output_lens[i]
    return steps


@dataclass(frozen=True)
class Floor:
    decode_s: float  # sum over steps of max(bytes / bandwidth, flops / peak)
    prefill_s: float
    weights_s: float  # weight bytes x steps / bandwidth
    kv_s: float  # KV bytes read / bandwidth
    compute_s: float  # every FLOP (decode and prefill) / peak
    steps: int
    compute_bound_steps: int
    weight_bytes: int
    output_tokens: int

    @property
    def total_s(self) -> float:
        return self.decode_s + self.prefill_s

    @property
    def memory_s(self) -> float:
        return self.weights_s + self.kv_s

    @property
    def overlap_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.total_s


def shape_floor(
    shape: ModelShape,
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    *,
    kv_bytes: int = 2,
    fp8_weights: bool = False,
    max_running: int | None = None,
    kv_capacity_tokens: int | None = None,
    bandwidth: float = H200_BANDWIDTH,
    peak: float = H200_PEAK,
) -> Floor:
    """The floor of these requests (module docstring); ``max_running`` None runs them all at once."""
    head_params = shape.matmul_params - shape.body_params
    body_peak = 2 * peak if fp8_weights else peak
    weight_bytes = (1 if fp8_weights else 2) * shape.body_params + 2 * head_params
    kv_bytes_per_token = kv_bytes * shape.kv_elements_per_token
    attn = shape.attn_flops_per_context_token
    steps = decode_steps(prompt_lens, output_lens, max_running or len(prompt_lens), kv_capacity_tokens)
    decode_s = kv_s = decode_compute_s = 0.0
    compute_bound = 0
    for batch, context in steps:
        memory = (weight_bytes + context * kv_bytes_per_token) / bandwidth
        compute = 2 * shape.body_params * batch / body_peak + (2 * head_params * batch + attn * context) / peak
        decode_compute_s += compute
        decode_s += max(memory, compute)
        kv_s += context * kv_bytes_per_token / bandwidth
        compute_bound += compute > memory
    prefill_s = sum(2 * shape.body_params * p / body_peak + attn * p * p / 2 / peak for p in prompt_lens)
    return Floor(
        decode_s=decode_s,
        prefill_s=prefill_s,
        weights_s=len(steps) * weight_bytes / bandwidth,
        kv_s=kv_s,
        compute_s=decode_compute_s + prefill_s,
        steps=len(steps),
        compute_bound_steps=compute_bound,
        weight_bytes=weight_bytes,
        output_tokens=sum(output_lens),
    )


def floor_seconds(
    config: dict, bandwidth: float = H200_BANDWIDTH, peak: float = H200_PEAK
) -> dict[str, float]:
    """The standard offline benchmark's floor (all 256 requests at once, bf16 KV)."""
    w = standard_workload()
    f = shape_floor(
        ModelShape.from_config(config),
        [len(p) for p in w.prompts],
        w.max_tokens,
        bandwidth=bandwidth,
        peak=peak,
    )
    return {"decode_s": f.decode_s, "prefill_s": f.prefill_s, "total_s": f.total_s, "kv_only_s": f.kv_s,
            "weight_gb": f.weight_bytes / 1e9, "output_tokens": f.output_tokens}  # fmt: skip


def describe(f: Floor) -> str:
    """One line: the floor, its parts and the best tokens per second it allows."""
    return (
        f"floor {f.total_s:.2f} s = {f.tok_per_s:,.0f} tok/s at best (decode {f.decode_s:.2f} s over "
        f"{f.steps} steps, {f.compute_bound_steps} compute-bound; weights {f.weights_s:.2f} + KV reads "
        f"{f.kv_s:.2f} s; prefill {f.prefill_s:.2f} s; prefill hidden in decode: {f.overlap_s:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("configs", nargs="*", help="config.json files: the standard workload's floor")
    parser.add_argument("--preset", default=None, help="an at_scale.py preset: its model and shape")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=sorted(KV_BYTES))
    parser.add_argument("--fp8-weights", action="store_true", help="the projections in FP8 (quantization fp8)")
    parser.add_argument("--max-running", type=int, default=None, help="running requests (default: all)")
    parser.add_argument("--kv-capacity-tokens", type=int, default=None, help="KV pool size in tokens")
    parser.add_argument("--bandwidth", type=float, default=H200_BANDWIDTH)
    parser.add_argument("--peak", type=float, default=H200_PEAK)
    args = parser.parse_args()
    if args.preset:
        from at_scale import PRESETS

        preset = PRESETS[args.preset]
        f = shape_floor(
            ModelShape.from_config(json.loads(Path(preset.model).read_text())),
            [preset.prompt_len] * preset.num_requests,
            [preset.output_len] * preset.num_requests,
            kv_bytes=KV_BYTES[args.kv_cache_dtype],
            fp8_weights=args.fp8_weights,
            max_running=args.max_running,
            kv_capacity_tokens=args.kv_capacity_tokens,
            bandwidth=args.bandwidth,
            peak=args.peak,
        )
        weights = "fp8" if args.fp8_weights else "bf16"
        print(f"{args.preset} ({preset.describe()}, KV {args.kv_cache_dtype}, weights {weights}): {describe(f)}")
    w = standard_workload()
    for path in args.configs:
        f = shape_floor(
            ModelShape.from_config(json.loads(Path(path).read_text())),
            [len(p) for p in w.prompts],
            w.max_tokens,
            kv_bytes=KV_BYTES[args.kv_cache_dtype],
            fp8_weights=args.fp8_weights,
            bandwidth=args.bandwidth,
            peak=args.peak,
        )
        print(f"{path} (standard workload, KV {args.kv_cache_dtype}): {describe(f)}")


if __name__ == "__main__":
    main()
