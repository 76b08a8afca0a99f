"""The physical floor of a workload shape for a model config on one GPU.

Decode: requests run under an ideal continuous-batching scheduler (at most ``max_running``
at once, and, when a KV capacity is given, only as many as fit with their whole final
length reserved: it never retracts). A request with ``m`` output tokens takes ``m`` decode
steps, reading ``prompt_len + s`` context tokens at its step ``s``. Per step the B running
requests read the weights once (the LM head included, embedding rows aside; of a
Mixture-of-Experts layer only the experts at least one of the B tokens selects, expected
under uniform routing: benchmarks/model_shape.py) and their live KV, and do
``2 * active_params * B`` matmul FLOPs (a MoE token multiplies with its top-k experts only)
plus attention FLOPs; a step costs at least max(bytes / bandwidth, flops / peak). Prefill is
counted as compute at peak (its weight reads are amortised over thousands of tokens). FP8 KV
(``kv_bytes`` 1) halves the KV bytes; FP8 weights (``fp8_weights``: the decoder's projections
and experts in e4m3, the LM head and MoE routers in bf16) halve their bytes and run their
FLOPs at twice the bf16 peak. Ceilings default to what was measured on the H200 here:
~4.3 TB/s copy bandwidth and ~790 TFLOP/s dense bf16 (FP8: 2x, the datasheet's ratio; not
measured). docs/performance.md ("The floor") writes the formula out. ``measure_ceilings``
takes the two on the card at hand (at_scale.py prints its floor beside the H200's).

``memory_s + prefill_s`` (weights x steps + KV reads + prefill FLOPs, each at its ceiling) is
the floor whenever every decode step is bandwidth-bound; ``total_s`` takes the per-step max,
so it is never below it (``compute_bound_steps`` says how many steps were not). A scheduler
that mixes prefill into bandwidth-bound decode steps can hide prefill FLOPs under KV reads;
``overlap_s`` = max(all bytes / bandwidth, all FLOPs / peak) is the bound even then.

    python benchmarks/floor.py configs/qwen3-0.6b.json configs/qwen3-8b.json     # standard workload
    python benchmarks/floor.py --preset llama-3.1-8b --kv-cache-dtype fp8_e4m3     # at-scale shape
    python benchmarks/floor.py --preset qwen3-30b-a3b --kv-cache-dtype fp8_e4m3 --fp8-weights
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_shape import ModelShape  # noqa: E402
from offline import standard_workload  # noqa: E402

if TYPE_CHECKING:
    import torch

H200_BANDWIDTH = 4.3e12  # bytes/s
H200_PEAK = 790e12  # dense bf16 FLOP/s
KV_BYTES = {"auto": 2, "bf16": 2, "fp8_e4m3": 1}  # bytes per KV element ("auto": the bf16 model dtype)


class _WindowedContext:
    """The sum over running requests of min(context, window), kept step by step: a request's
    context grows by one token a step until it reaches the window, then stays at it (window 0:
    no window, the plain context sum)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.below_total = self.below = self.at_window = 0  # summed context, count; count at the window
        self.reaching: list[tuple[int, int]] = []  # heap of (step its context reaches the window, request)
        self.full: dict[int, bool] = {}  # running request -> at the window

    @property
    def total(self) -> int:
        return self.below_total + self.at_window * self.window

    def admit(self, request: int, prompt_len: int, step: int) -> None:
        self.full[request] = bool(self.window) and prompt_len >= self.window
        if self.full[request]:
            self.at_window += 1
            return
        self.below_total += prompt_len
        self.below += 1
        if self.window:
            heapq.heappush(self.reaching, (step + self.window - prompt_len, request))

    def advance(self, step: int) -> None:
        """Every running context gained a token; those that reached the window stop there."""
        self.below_total += self.below
        while self.reaching and self.reaching[0][0] <= step:
            _, request = heapq.heappop(self.reaching)
            if self.full.get(request) is False:  # NOTE: not an entry of a request already done
                self.full[request] = True
                self.below_total -= self.window
                self.below -= 1
                self.at_window += 1

    def finish(self, request: int, context: int) -> None:
        if self.full.pop(request):
            self.at_window -= 1
        else:
            self.below_total -= context
            self.below -= 1


def decode_steps(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_running: int,
    kv_capacity_tokens: int | None = None,
    window: int = 0,
) -> list[tuple[int, int, int]]:
    """(running requests, live context tokens, the same each capped at ``window``) of every
    decode step, admitting in order."""
    if max_running < 1:
        raise ValueError(f"max_running={max_running}: must be >= 1")
    steps: list[tuple[int, int, int]] = []
    running: list[tuple[int, int]] = []  # heap of (step after its last, request index)
    windowed = _WindowedContext(window)
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
                windowed.admit(admitted - 1, p, step)
                context += p
                reserved += p + m
        steps.append((len(running), context, windowed.total))
        step += 1
        context += len(running)  # every running request's context grows by its new token
        windowed.advance(step)
        while running and running[0][0] == step:
            _, i = heapq.heappop(running)
            context -= prompt_lens[i] + output_lens[i]
            reserved -= prompt_lens[i] + output_lens[i]
            windowed.finish(i, prompt_lens[i] + output_lens[i])
    return steps


def causal_pairs(prompt_len: int, window: int = 0) -> float:
    """(query, key) pairs of a causal prefill, each query seeing at most ``window`` keys (0: all):
    p^2 / 2 as the floor counts it (the diagonal's half aside)."""
    if not window or prompt_len <= window:
        return prompt_len * prompt_len / 2
    return window * window / 2 + (prompt_len - window) * window


@dataclass(frozen=True)
class Floor:
    decode_s: float  # sum over steps of max(bytes / bandwidth, flops / peak)
    prefill_s: float
    weights_s: float  # the weight bytes each step reads, summed, / bandwidth
    kv_s: float  # KV bytes read / bandwidth
    compute_s: float  # every FLOP (decode and prefill) / peak
    steps: int
    compute_bound_steps: int
    weight_bytes: int  # every weight (all experts): what a step reads at most
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
    head_params = shape.head_params
    body_peak = 2 * peak if fp8_weights else peak
    body_bytes = 1 if fp8_weights else 2
    # per layer: KV bytes of one context token, q.k + p.v FLOPs of one query against it
    kv_layer_bytes = kv_bytes * 2 * shape.kv_heads * shape.head_dim
    attn_layer = 4 * shape.heads * shape.head_dim
    full_layers, window_layers, window = shape.layers - shape.window_layers, shape.window_layers, shape.window
    active = shape.active_body_params
    steps = decode_steps(
        prompt_lens, output_lens, max_running or len(prompt_lens), kv_capacity_tokens, window
    )
    decode_s = weights_s = kv_s = decode_compute_s = 0.0
    compute_bound = 0
    for batch, context, windowed in steps:
        layer_tokens = full_layers * context + window_layers * windowed  # context read, all layers
        weight_bytes = body_bytes * shape.step_body_params(batch) + 2 * head_params
        memory = (weight_bytes + layer_tokens * kv_layer_bytes) / bandwidth
        compute = (
            2 * active * batch / body_peak + (2 * head_params * batch + attn_layer * layer_tokens) / peak
        )
        decode_compute_s += compute
        decode_s += max(memory, compute)
        weights_s += weight_bytes / bandwidth
        kv_s += layer_tokens * kv_layer_bytes / bandwidth
        compute_bound += compute > memory
    prefill_s = sum(
        2 * active * p / body_peak
        + attn_layer * (full_layers * causal_pairs(p) + window_layers * causal_pairs(p, window)) / peak
        for p in prompt_lens
    )
    return Floor(
        decode_s=decode_s,
        prefill_s=prefill_s,
        weights_s=weights_s,
        kv_s=kv_s,
        compute_s=decode_compute_s + prefill_s,
        steps=len(steps),
        compute_bound_steps=compute_bound,
        weight_bytes=body_bytes * shape.body_params + 2 * head_params,
        output_tokens=sum(output_lens),
    )


def measure_ceilings(reps: int = 5) -> tuple[float, float]:
    """This machine's (copy bandwidth in bytes/s, dense bf16 GEMM FLOP/s): a 2 GiB tensor copied
    into another (bytes read plus written per second) and an 8,192-square bf16 product, medians of
    ``reps`` after a warm-up; on CUDA when there is one (else 64 MiB and 512 square on the CPU,
    for smoke runs). What the caching allocator holds is released first (an engine just torn
    down), and its buffers before it returns."""
    import gc

    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
    device, nbytes, n = ("cuda", 2**31, 8192) if cuda else ("cpu", 2**26, 512)
    bandwidth = 2 * nbytes / _median_s(torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device), reps)
    a, b = (torch.randn(n, n, device=device).to(torch.bfloat16) for _ in range(2))
    peak = 2 * n**3 / _median_s(a, reps, b)
    if cuda:
        torch.cuda.empty_cache()
    return bandwidth, peak


def _median_s(x: torch.Tensor, reps: int, other: torch.Tensor | None = None) -> float:
    """Median seconds of ``x @ other``, or without ``other`` of copying ``x`` into a new tensor
    of its size, after one warm-up call."""
    import statistics

    from gpu_timing import event_ms

    out = x.new_empty(x.shape)
    fn = (lambda: out.copy_(x)) if other is None else (lambda: x @ other)
    fn()
    return statistics.median(event_ms(fn) for _ in range(reps)) / 1e3


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
    parser.add_argument(
        "--fp8-weights", action="store_true", help="the projections in FP8 (quantization fp8)"
    )
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
        print(
            f"{args.preset} ({preset.describe()}, KV {args.kv_cache_dtype}, weights {weights}): {describe(f)}"
        )
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
