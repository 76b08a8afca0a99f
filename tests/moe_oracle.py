"""What the fused MoE kernel's tests and benchmark share besides their oracle (routing draws
and the error measure). The oracle itself is worker.kernels.moe.experts_loop, the engine's CPU
path: a loop over the chosen experts in float32 sums, FP8 products emulated exactly in float32
(tests/unit/test_moe.py checks it against float64 written from the definition)."""

from __future__ import annotations

import torch


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
