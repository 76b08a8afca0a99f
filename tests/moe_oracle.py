"""What the fused MoE kernel's tests and benchmark share besides their oracle (routing draws
and the error measure). The oracle itself is worker.kernels.moe.experts_loop, the engine's CPU
path: a loop over the chosen experts in float32 sums, FP8 products emulated exactly in float32
(tests/unit/test_moe.py checks it against float64 written from the definition). For FP8
experts, ``float64_truth`` is what the loop and the kernel both approximate: the same
(dequantized) weights with nothing rounded or quantized between the GEMMs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def float64_truth(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MoE layer in float64 (worker.kernels.moe's contract, FP8 weights dequantized by their
    per-channel scales), activations neither quantized nor rounded."""
    w13, w2 = w13.double(), w2.double()
    if w13_scale is not None and w2_scale is not None:
        w13, w2 = w13 * w13_scale.double()[..., None], w2 * w2_scale.double()[..., None]
    x64, inter = x.double(), w2.shape[-1]
    out = torch.zeros(x64.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        if not 0 <= e < w13.shape[0]:
            continue
        token, slot = torch.where(topk_ids == e)
        gate_up = x64[token] @ w13[e].t()
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, token, (h @ w2[e].t()) * topk_weights[token, slot, None].double())
    return out


def truth_errors(got: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(||got - truth|| / ||truth||, max |got - truth| / max |truth|)."""
    diff = got.double() - truth
    return (diff.norm() / truth.norm()).item(), (diff.abs().max() / truth.abs().max()).item()
