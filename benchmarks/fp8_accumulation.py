"""A CPU model of Hopper's FP8 tensor-core accumulation, and what it does to one MoE expert's
gated MLP against the exact loop (worker.kernels.moe.experts_loop's arithmetic), under two rules
for the intermediate's per-row e4m3 scale.

The model (SageAttention2 and DeepSeek-V3's measurements of wgmma with e4m3 operands): each
instruction adds the exact sum of 32 products to an accumulator that keeps 13 bits of mantissa,
the lower 10 of float32's truncated. A strategy is where the sums leave that accumulator for a
float32 one (``promote``: every that many products; never, or on every product of an exact
fp16 GEMM). The layer is worker.kernels.fused_moe's: per-row e4m3 activations, gate/up rounded
to bf16, SiLU-mul rounded to bf16 and quantized per row again, down rounded to bf16.

Scale rules of the intermediate (``--scales``; the weights keep max/448 per output channel, the
input activations max/448 per row):

    rowmax  scale = max|row| / 448: a sum off by 1e-4 can move a row's maximum by a bf16 step,
            which changes the scale and so the rounding of every element of the row
    pow2    scale = 2**ceil(log2(max|row| / 448)): e4m3's grid is the same at every power-of-two
            scale (normal values), and the scale moves only when the maximum crosses a power of
            two; what the inexact sums still change is single elements' rounding

For each rule the loop (float64 sums) uses the same rule: the kernel is measured against what it
is meant to compute. Printed per shape, rule and strategy: the gate/up GEMM's max relative error,
the intermediate's rows with another scale than the loop's and the share of its elements with
another e4m3 value, the layer's max relative error against the loop (the GPU test's measure,
tests/moe_oracle.relative_error; its bound is 1e-2) and against the truth (float64, the same
e4m3 weights, activations not quantized: the quality the rule costs or buys), the last also
as a norm ratio, ||error|| / ||truth||, which no single element decides.

    python benchmarks/fp8_accumulation.py                       # about 1 min on one CPU core
    python benchmarks/fp8_accumulation.py --rows 512 --scales pow2   # quicker
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

E4M3_MAX = 448.0
INSTRUCTION_K = 32  # products one wgmma adds into its accumulator
EXACT = 0  # promote: every product (an fp16 GEMM: exact products, float32 sums)
NEVER = 1 << 30
RULES = ("rowmax", "pow2")

# name -> (gate/up promote, down promote)
STRATEGIES: dict[str, tuple[int, int]] = {
    "fp8 accumulator, whole K (fast_fp8)": (NEVER, NEVER),
    "gate/up fp8 whole K, down every 64": (NEVER, 64),
    "fp8, promoted every 128": (128, 128),
    "fp8, promoted every 32": (32, 32),
    "gate/up exact, down every 64 (kernel)": (EXACT, 64),
    "exact (fp16 products, float32 sums)": (EXACT, EXACT),
}
SHAPES = {"qwen3-30b-a3b": (2048, 768), "mixtral-8x7b": (4096, 14336)}  # (hidden, intermediate)

Gemm = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


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


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """2**ceil(log2(amax / 448)) of float32 amax > 0, exactly: p = the least power of two >= amax
    (carry the mantissa into the exponent), then p / 512 unless amax > 448 / 512 * p."""
    p = ((amax.float().view(torch.int32) + 0x7FFFFF) & 0x7F800000).view(torch.float32)
    return torch.where(amax <= 0.875 * p, p / 512, p / 256)


def e4m3_rows(x: torch.Tensor, rule: str = "rowmax") -> tuple[torch.Tensor, torch.Tensor]:
    """(values rounded to e4m3 after dividing by the row's scale, the scale [rows, 1])."""
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax / E4M3_MAX if rule == "rowmax" else pow2_scale(amax)
    return (x / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float(), scale


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


def float64_gemm(a: torch.Tensor, b: torch.Tensor, _promote: int) -> torch.Tensor:
    """The loop's products and sums (float64, rounded once)."""
    return (a.double() @ b.double()).float()


class Weights:
    """One expert's e4m3 weights with one scale per output channel (worker.models.fp8)."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        (self.w13, self.w13_scale), (self.w2, self.w2_scale) = e4m3_rows(w13), e4m3_rows(w2)
        self.inter = w13.shape[0] // 2

    def truth(self, x: torch.Tensor) -> torch.Tensor:
        """The layer in float64 on these e4m3 weights, activations neither quantized nor rounded."""
        gate_up = x.double() @ (self.w13.double() * self.w13_scale.double()).t()
        act = torch.nn.functional.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :]
        return act @ (self.w2.double() * self.w2_scale.double()).t()


def gate_up_layer(x: torch.Tensor, w: Weights, gemm: Gemm, promote: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate/up product in float32, the SiLU-mul output rounded as the kernel rounds it)."""
    x_q, x_s = e4m3_rows(x)
    gate_up = gemm(x_q, w.w13.t(), promote) * x_s * w.w13_scale.t()
    gate, up = bf16(gate_up[:, : w.inter]), bf16(gate_up[:, w.inter :])
    return gate_up, bf16(bf16(torch.nn.functional.silu(gate)) * up)


def down_layer(
    act: torch.Tensor, w: Weights, rule: str, gemm: Gemm, promote: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, the intermediate in e4m3, its row scales) under one scale rule."""
    act_q, act_s = e4m3_rows(act, rule)
    return bf16(gemm(act_q, w.w2.t(), promote) * act_s * w.w2_scale.t()), act_q, act_s


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def rms_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want||: the error of the whole output, less at the mercy of one element."""
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def run_shape(name: str, count: int, rules: list[str], strategies: list[str]) -> list[dict]:
    """Every (rule, strategy) row of one shape; the gate/up product is shared across rules."""
    hidden, inter = SHAPES[name]
    x = torch.randn(count, hidden)
    w = Weights(torch.randn(2 * inter, hidden) / hidden**0.5, torch.randn(hidden, inter) / inter**0.5)
    truth = w.truth(x)
    want_gate_up, want_act = gate_up_layer(x, w, float64_gemm, EXACT)
    loops = {rule: down_layer(want_act, w, rule, float64_gemm, EXACT) for rule in rules}
    rows: list[dict] = []
    for rule in rules:
        want, want_q, want_s = loops[rule]
        rows.append({"shape": name, "rows": count, "scales": rule, "strategy": "loop (float64 sums)",
                     "gate_up_error": 0.0, "rescaled_rows": 0, "flipped": 0.0, "vs_loop": 0.0,
                     "vs_truth": relative_error(want, truth), "rms_vs_truth": rms_error(want, truth)})  # fmt: skip
    for strategy in strategies:
        promote = STRATEGIES[strategy]
        gate_up, act = gate_up_layer(x, w, tensor_core_gemm, promote[0])
        for rule in rules:
            want, want_q, want_s = loops[rule]
            out, act_q, act_s = down_layer(act, w, rule, tensor_core_gemm, promote[1])
            rows.append({"shape": name, "rows": count, "scales": rule, "strategy": strategy,
                         "gate_up_error": relative_error(gate_up, want_gate_up),
                         "rescaled_rows": int((act_s != want_s).sum()),
                         "flipped": (act_q != want_q).double().mean().item(),
                         "vs_loop": relative_error(out, want), "vs_truth": relative_error(out, truth),
                         "rms_vs_truth": rms_error(out, truth)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=2048, help="routed rows of the Qwen3 shape (Mixtral: an eighth)"
    )
    parser.add_argument("--scales", default=",".join(RULES), help=f"intermediate scale rules, of {RULES}")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {tuple(SHAPES)}")
    parser.add_argument("--strategies", default="all", help="'all' or indices into STRATEGIES (e.g. 0,3)")
    args = parser.parse_args(argv)
    rules = args.scales.split(",")
    if not set(rules) <= set(RULES):
        parser.error(f"--scales: expected some of {RULES}, got {args.scales!r}")
    names = list(STRATEGIES)
    strategies = names if args.strategies == "all" else [names[int(i)] for i in args.strategies.split(",")]
    torch.manual_seed(0)
    rows: list[dict] = []
    print("| shape | rows | scales | strategy | gate/up GEMM error | rows with another scale | "
          "elements with another e4m3 value | vs loop | vs truth | vs truth (rms) |")  # fmt: skip
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.shapes.split(","):
        count = args.rows if name.startswith("qwen") else max(1, args.rows // 8)
        for row in run_shape(name, count, rules, strategies):
            rows.append(row)
            print(f"| {name} | {count} | {row['scales']} | {row['strategy']} | {row['gate_up_error']:.1e} | "
                  f"{row['rescaled_rows']} | {row['flipped']:.2%} | {row['vs_loop']:.1e} | "
                  f"{row['vs_truth']:.1e} | {row['rms_vs_truth']:.2e} |", flush=True)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
