"""A CPU model of Hopper's FP8 tensor-core accumulation, and what it does to one MoE expert's
gated MLP against the exact float32 loop (worker.kernels.moe.experts_loop's arithmetic).

The model (SageAttention2 and DeepSeek-V3's measurements of wgmma with e4m3 operands): each
instruction adds the exact sum of 32 products to an accumulator that keeps 13 bits of mantissa,
the lower 10 of float32's truncated. A strategy is where the sums leave that accumulator for a
float32 one (``promote``: every that many products; never, or on every product of an exact
fp16 GEMM). The layer is worker.kernels.fused_moe's: per-row e4m3 activations, gate/up rounded
to bf16, SiLU-mul rounded to bf16 and quantized per row again, down rounded to bf16.

Printed per shape and strategy: the gate/up GEMM's max relative error, how many rows of the
intermediate got another e4m3 scale than the exact computation's, and the layer's max relative
error (the GPU test's measure; its bound is 1e-2).

    python benchmarks/fp8_accumulation.py                 # 1-3 min on 2 CPU cores
    python benchmarks/fp8_accumulation.py --rows 512      # quicker, fewer rows to flip
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

E4M3_MAX = 448.0
INSTRUCTION_K = 32  # products one wgmma adds into its accumulator
EXACT = 0  # promote: every product (an fp16 GEMM: exact products, float32 sums)
NEVER = 1 << 30

# name -> (gate/up promote, down promote)
STRATEGIES: dict[str, tuple[int, int]] = {
    "fp8 accumulator, whole K (fast_fp8)": (NEVER, NEVER),
    "fp8, promoted every 128": (128, 128),
    "fp8, promoted every 32": (32, 32),
    "gate/up exact, down every 64 (kernel)": (EXACT, 64),
    "exact (fp16 products, float32 sums)": (EXACT, EXACT),
}
SHAPES = {"qwen3-30b-a3b": (2048, 768), "mixtral-8x7b": (4096, 14336)}  # (hidden, intermediate)


def truncate_mantissa(x: torch.Tensor, keep_bits: int = 13) -> torch.Tensor:
    """float32 x with all but the top ``keep_bits`` of its 23 mantissa bits zeroed (toward zero)."""
    mask = ~((1 << (23 - keep_bits)) - 1)
    return (x.view(torch.int32) & mask).view(torch.float32)


def tensor_core_gemm(a: torch.Tensor, b: torch.Tensor, promote: int) -> torch.Tensor:
    """a [M, K] @ b [K, N] (e4m3 values as float32) as the model accumulates it."""
    if promote == EXACT:
        return a @ b
    out = torch.zeros(a.shape[0], b.shape[1])
    part = torch.zeros_like(out)
    for k0 in range(0, a.shape[1], INSTRUCTION_K):
        part = truncate_mantissa(part + a[:, k0 : k0 + INSTRUCTION_K] @ b[k0 : k0 + INSTRUCTION_K])
        if (k0 + INSTRUCTION_K) % promote == 0:
            out, part = out + part, torch.zeros_like(out)
    return out + part


def e4m3_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values rounded to e4m3 after dividing by the row's scale, the scale [rows, 1])."""
    scale = (x.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float(), scale


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


def float64_gemm(a: torch.Tensor, b: torch.Tensor, _promote: int) -> torch.Tensor:
    """The reference's products and sums (float64, rounded once)."""
    return (a.double() @ b.double()).float()


def layer(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, gemm: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    promote: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(output, gate/up product, the intermediate's row scales) of one expert on rows x."""
    (w13_q, w13_s), (w2_q, w2_s) = e4m3_rows(w13), e4m3_rows(w2)
    x_q, x_s = e4m3_rows(x)
    inter = w13.shape[0] // 2
    gate_up = gemm(x_q, w13_q.t(), promote[0]) * x_s * w13_s.t()
    gate, up = bf16(gate_up[:, :inter]), bf16(gate_up[:, inter:])
    act_q, act_s = e4m3_rows(bf16(bf16(torch.nn.functional.silu(gate)) * up))
    return bf16(gemm(act_q, w2_q.t(), promote[1]) * act_s * w2_s.t()), gate_up, act_s


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=2048, help="routed rows of the Qwen3 shape (Mixtral: an eighth)"
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows: list[dict] = []
    print("| shape | rows | strategy | gate/up GEMM error | rows with another scale | layer error |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for name, (hidden, inter) in SHAPES.items():
        count = args.rows if name.startswith("qwen") else max(1, args.rows // 8)
        x = torch.randn(count, hidden)
        w13, w2 = torch.randn(2 * inter, hidden) / hidden**0.5, torch.randn(hidden, inter) / inter**0.5
        want, want_gate_up, want_scale = layer(x, w13, w2, float64_gemm, (EXACT, EXACT))
        for strategy, promote in STRATEGIES.items():
            out, gate_up, scale = layer(x, w13, w2, tensor_core_gemm, promote)
            row = {"shape": name, "rows": count, "strategy": strategy,
                   "gate_up_error": relative_error(gate_up, want_gate_up),
                   "rescaled_rows": int((scale != want_scale).sum()), "layer_error": relative_error(out, want)}  # fmt: skip
            rows.append(row)
            print(f"| {name} | {count} | {strategy} | {row['gate_up_error']:.1e} | {row['rescaled_rows']} | "
                  f"{row['layer_error']:.1e} |", flush=True)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
