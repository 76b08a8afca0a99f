"""The MoE kernels benchmarks/moe_kernel.py times, each as ``prepare(layer, inputs) -> call``,
and the timing itself.

    triton      worker.kernels.fused_moe (bf16; FP8 per-channel weights, per-token activations;
                FP8 gate/up products exact in fp16)
    triton-tile the same with ``fp8_sums="tile"`` (FP8 only: gate/up in the FP8 tensor cores,
                sums moved to float32 every K tile)
    triton-fast the same with ``fp8_sums="fast"`` (FP8 only: the gate/up sum wholly in the FP8
                tensor core's accumulator)
    flashinfer  flashinfer.fused_moe.cutlass_fused_moe 0.6.6 (bf16; FP8 per-tensor scales, the
                only FP8 scheme it takes on sm90: weights per expert, activations static,
                calibrated on this input; the input's quantization is inside the timed call)
    loop        a torch loop over experts in the model dtype (F.linear; FP8: torch._scaled_mm
                with row-wise scales, as worker.models.fp8.Fp8Linear), the speed baseline
                (every candidate's error is measured against worker.kernels.moe.experts_loop)

Inputs are drawn from seeds only, so the driver and a child process (flashinfer runs in one)
build the same ones.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpu_timing import event_ms  # noqa: E402

from tests.moe_oracle import float64_truth, uniform_routing  # noqa: E402
from worker.kernels import ops  # noqa: E402
from worker.models.fp8 import emulated_fp8_matmul, quantize_channels  # noqa: E402

E4M3_MAX = 448.0


@dataclass(frozen=True)
class ExpertShape:
    num_experts: int
    top_k: int
    hidden: int
    inter: int

    def flops(self, tokens: int) -> int:
        """2 * T * k * (H * 2I + I * H): the gate/up and down products of every routed token."""
        return 2 * tokens * self.top_k * (self.hidden * 2 * self.inter + self.inter * self.hidden)

    def expert_bytes(self, fp8: bool) -> int:
        """One expert's weights (and FP8 scales) as the kernels read them."""
        if fp8:
            return 3 * self.hidden * self.inter + 4 * (2 * self.inter + self.hidden)
        return 2 * 3 * self.hidden * self.inter


@dataclass
class Layer:
    """One MoE layer's experts: bf16 (w13 [E, 2I, H], w2 [E, H, I]) and, for FP8, e4m3 with one
    scale per output channel."""

    shape: ExpertShape
    fp8: bool
    w13: torch.Tensor
    w2: torch.Tensor
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    master: tuple[torch.Tensor, torch.Tensor] | None = None  # the bf16 weights FP8 came from

    @classmethod
    def random(cls, shape: ExpertShape, fp8: bool, seed: int = 0, device: str = "cuda") -> Layer:
        gen = torch.Generator(device=device).manual_seed(seed)
        e, h, i = shape.num_experts, shape.hidden, shape.inter
        w13 = (torch.randn(e, 2 * i, h, device=device, generator=gen) / h**0.5).bfloat16()
        w2 = (torch.randn(e, h, i, device=device, generator=gen) / i**0.5).bfloat16()
        if not fp8:
            return cls(shape, False, w13, w2)
        (w13_q, w13_scale), (w2_q, w2_scale) = quantize_channels(w13), quantize_channels(w2)
        return cls(shape, True, w13_q, w2_q, w13_scale, w2_scale, master=(w13, w2))


@dataclass
class Inputs:
    x: torch.Tensor  # bf16 [T, H]
    topk_weights: torch.Tensor  # float32 [T, k]
    topk_ids: torch.Tensor  # int32 [T, k]

    @classmethod
    def random(cls, shape: ExpertShape, tokens: int, seed: int, device: str = "cuda") -> Inputs:
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(tokens, shape.hidden, generator=gen).bfloat16().to(device)
        weights, ids = uniform_routing(tokens, shape.num_experts, shape.top_k, gen, device=device)
        return cls(x, weights, ids)

    @property
    def active_experts(self) -> int:
        """Experts selected by at least one token: the ones whose weights a call reads."""
        return int(torch.unique(self.topk_ids).numel())


def prepare_triton(
    layer: Layer, inputs: Inputs, tiles: object = None, fp8_sums: str = "exact"
) -> Callable[[], torch.Tensor]:
    from worker.kernels.fused_moe import fused_moe

    scales = dict(w13_scale=layer.w13_scale, w2_scale=layer.w2_scale) if layer.fp8 else {}
    return lambda: fused_moe(
        inputs.x, layer.w13, layer.w2, inputs.topk_weights, inputs.topk_ids, tiles=tiles, fp8_sums=fp8_sums,
        **scales,
    )  # fmt: skip


def prepare_triton_tile(layer: Layer, inputs: Inputs, tiles: object = None) -> Callable[[], torch.Tensor]:
    return prepare_triton(layer, inputs, tiles, fp8_sums="tile")


def prepare_triton_fast(layer: Layer, inputs: Inputs, tiles: object = None) -> Callable[[], torch.Tensor]:
    return prepare_triton(layer, inputs, tiles, fp8_sums="fast")


# the fp8_sums of each Triton candidate (worker.kernels.moe_tiles.tile_kind picks its tiles)
TRITON_SUMS = {"triton": "exact", "triton-tile": "tile", "triton-fast": "fast"}


def oracle(layer: Layer, inputs: Inputs) -> torch.Tensor:
    """The layer by worker.kernels.moe.experts_loop: what every candidate's error is measured against."""
    from worker.kernels.moe import experts_loop

    scales = dict(w13_scale=layer.w13_scale, w2_scale=layer.w2_scale) if layer.fp8 else {}
    return experts_loop(inputs.x, layer.w13, layer.w2, inputs.topk_weights, inputs.topk_ids, **scales)


def truth(layer: Layer, inputs: Inputs) -> torch.Tensor:
    """The layer in float64 on the same (dequantized) weights with nothing rounded or quantized
    in between (tests.moe_oracle.float64_truth): what the FP8 arithmetic of every candidate, the
    loop's included, approximates (benchmarks/moe_kernel.py ``--truth``)."""
    return float64_truth(inputs.x, layer.w13, layer.w2, inputs.topk_weights, inputs.topk_ids,
                         layer.w13_scale, layer.w2_scale)  # fmt: skip


def _expert_linear(layer: Layer, h: torch.Tensor, expert: int, down: bool) -> torch.Tensor:
    weight = (layer.w2 if down else layer.w13)[expert]
    if not layer.fp8:
        return F.linear(h, weight)
    scale = (layer.w2_scale if down else layer.w13_scale)[expert]  # type: ignore[index]
    rows = ops.quantize_fp8_rows(h)
    if not h.is_cuda:  # the CPU test of this loop: the same product, emulated
        return emulated_fp8_matmul(rows, weight, scale).to(h.dtype)
    return torch._scaled_mm(
        rows.data, weight.t(), scale_a=rows.scale[:, None], scale_b=scale[None, :], out_dtype=h.dtype
    )


def torch_loop(
    layer: Layer, inputs: Inputs, on_act: Callable[[torch.Tensor], None] | None = None
) -> torch.Tensor:
    """The layer by a loop over experts in the model dtype; ``on_act`` sees each SiLU-mul output."""
    x, inter = inputs.x, layer.shape.inter
    total = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in range(layer.shape.num_experts):
        tokens, slots = (inputs.topk_ids == expert).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        gate_up = _expert_linear(layer, x[tokens], expert, down=False)
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        if on_act is not None:
            on_act(act)
        y = _expert_linear(layer, act, expert, down=True)
        total.index_add_(0, tokens, y.float() * inputs.topk_weights[tokens, slots, None])
    return total.to(x.dtype)


def prepare_loop(layer: Layer, inputs: Inputs) -> Callable[[], torch.Tensor]:
    return lambda: torch_loop(layer, inputs)


def prepare_flashinfer(layer: Layer, inputs: Inputs) -> Callable[[], torch.Tensor]:
    """cutlass_fused_moe on this layer, its GEMM tactics tuned for these tokens by one call under
    flashinfer's autotuner: fc1 as [up; gate] (the order of its gated activation)."""
    from flashinfer.autotuner import autotune

    call = _flashinfer_call(layer, inputs)
    with autotune(True):
        call()
    return call


def _flashinfer_call(layer: Layer, inputs: Inputs) -> Callable[[], torch.Tensor]:
    from flashinfer.fused_moe import cutlass_fused_moe

    inter = layer.shape.inter
    w13, fc2 = layer.master if layer.fp8 else (layer.w13, layer.w2)  # type: ignore[misc]
    fc1 = torch.cat([w13[:, inter:], w13[:, :inter]], dim=1).contiguous()
    out = torch.empty_like(inputs.x)
    x_scale, quant_scales = None, None
    if layer.fp8:  # static per-tensor scales: the activations' calibrated on this input
        amaxes: list[torch.Tensor] = []
        torch_loop(
            Layer(layer.shape, False, w13, fc2), inputs, on_act=lambda a: amaxes.append(a.abs().amax())
        )
        x_scale = (inputs.x.abs().amax().float() / E4M3_MAX).reshape(())
        act_scale = (torch.stack(amaxes).amax().float() / E4M3_MAX).reshape(())
        (fc1, fc1_scale), (fc2, fc2_scale) = _per_tensor(fc1), _per_tensor(fc2)
        quant_scales = [fc1_scale * x_scale, 1.0 / act_scale, fc2_scale * act_scale, x_scale]

    def call() -> torch.Tensor:
        x = inputs.x
        if x_scale is not None:  # the input's quantization is part of the call
            x = (x.float() / x_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        cutlass_fused_moe(
            x, inputs.topk_ids, inputs.topk_weights, fc1, fc2, torch.bfloat16, quant_scales=quant_scales,
            output=out, tune_max_num_tokens=max(1, inputs.x.shape[0]),
        )  # fmt: skip
        return out

    return call


def _per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] as e4m3 with one float32 scale per expert."""
    scale = w.float().abs().amax(dim=(1, 2)) / E4M3_MAX
    return (w.float() / scale[:, None, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


PREPARE = {
    "triton": prepare_triton, "triton-tile": prepare_triton_tile, "triton-fast": prepare_triton_fast,
    "flashinfer": prepare_flashinfer, "loop": prepare_loop,
}  # fmt: skip
GRAPHED = {
    "triton": True,
    "triton-tile": True,
    "triton-fast": True,
    "flashinfer": True,
    "loop": False,
}  # the loop syncs on the host
FP8_ONLY = {"triton-tile", "triton-fast"}  # candidates that differ from another only on FP8 experts


def time_call(call: Callable[[], torch.Tensor], reps: int, graphed: bool) -> tuple[float, str]:
    """(median milliseconds of one call, "graph" or "eager"): after 3 warm-up calls, ``reps``
    calls each between CUDA events; replayed from a CUDA graph when it captures (as the
    engine's decode runs), else launched eagerly."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    run, mode = call, "eager"
    if graphed:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                call()
            run, mode = graph.replay, "graph"
        except RuntimeError:
            torch.cuda.synchronize()
    return statistics.median(event_ms(run) for _ in range(reps)), mode


def kernel_times(call: Callable[[], torch.Tensor], reps: int = 10) -> dict[str, float]:
    """Microseconds per call spent in each GPU kernel of ``call`` (torch.profiler over ``reps``
    eager calls after a warm-up; a kernel's time does not depend on how it was launched): where
    a fused MoE call's time goes (benchmarks/moe_kernel.py ``--kernels``)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0.0) or 0.0
        if device_us > 0:
            totals[event.key[:60]] = totals.get(event.key[:60], 0.0) + device_us / reps
    return dict(sorted(totals.items(), key=lambda item: -item[1]))
