"""The plain reference of a routed MoE layer: a loop over tokens' experts in float32, for the
fused kernel's tests (tests/unit/test_fused_moe_interpret.py, tests/gpu/test_fused_moe_gpu.py).

Written from the definition, independently of the kernels: each selected expert runs its gated
MLP on the token (gate and up rounded to the model dtype as two linear layers' outputs are, the
SiLU-mul rounded, the down projection rounded, times the routing weight, rounded), and the k
contributions add in float32 into one rounding. FP8 experts: weights dequantized with their
per-output-channel scales, and the activations before each projection quantized per row
(scale max|row| / 448, e4m3 round-to-nearest), as an FP8 GEMM sees them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

E4M3_MAX = 448.0


def quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x [R, K] as an FP8 GEMM sees it after per-row quantization, in float32."""
    x32 = x.float()
    scale = (x32.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=1e-12 / E4M3_MAX)
    return (x32 / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale


def moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    quantize: Callable[[torch.Tensor], torch.Tensor] = quantized_rows,
) -> torch.Tensor:
    """[T, H] in x's dtype; slots whose id is outside [0, E) add nothing. ``quantize`` is the
    per-row FP8 quantizer (values as the GEMM sees them), ``quantized_rows`` unless a test
    isolates the layer from its quantizer."""
    dtype = x.dtype
    num_experts, inter = w13.shape[0], w13.shape[1] // 2
    fp8 = w13.dtype == torch.float8_e4m3fn
    total = torch.zeros(x.shape, dtype=torch.float32, device=x.device)

    def round_(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype).float()

    for expert in range(num_experts):
        tokens, slots = (topk_ids == expert).nonzero(as_tuple=True)
        if tokens.numel() == 0:
            continue
        gate_up = w13[expert].float()
        down = w2[expert].float()
        h = x[tokens].float()
        if fp8:
            assert w13_scale is not None and w2_scale is not None
            gate_up = gate_up * w13_scale[expert, :, None]
            down = down * w2_scale[expert, :, None]
            h = quantize(h)
        projected = h @ gate_up.t()
        gate, up = round_(projected[:, :inter]), round_(projected[:, inter:])
        act = round_(round_(torch.nn.functional.silu(gate)) * up)
        if fp8:
            act = quantize(act)
        y = round_(act @ down.t())
        total.index_add_(0, tokens, round_(y * topk_weights[tokens, slots, None]))
    return total.to(dtype)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| over the whole tensor (the tests' measure)."""
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-30)).item()


def uniform_routing(
    num_tokens: int, num_experts: int, top_k: int, generator: torch.Generator, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights float32, topk_ids int32): k distinct experts per token drawn uniformly,
    weights a softmax over them."""
    scores = torch.rand(num_tokens, num_experts, generator=generator)
    ids = scores.topk(top_k, dim=-1).indices
    weights = torch.randn(num_tokens, top_k, generator=generator).softmax(dim=-1)
    return weights.to(device), ids.to(torch.int32).to(device)


def quantize_experts(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] weights as e4m3 with one float32 scale per output row (max|row| / 448)."""
    w32 = w.float()
    scale = (w32.abs().amax(dim=-1) / E4M3_MAX).clamp(min=1e-12)
    return (w32 / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale
