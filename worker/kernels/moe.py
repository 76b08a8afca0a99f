"""Mixture-of-Experts: top-k routing and the experts' gated MLPs (SiLU), on stacked weights.

    route(router_logits [T, E], top_k, renormalize)
        -> (topk_weights float32 [T, k], topk_ids int32 [T, k]); one kernel on CUDA with Triton
        on (worker.kernels.fused_moe.fused_route), torch elsewhere
    experts_loop(x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights, topk_ids,
                 *, w13_scale=None, w2_scale=None) -> [T, H] in x's dtype
    moe_experts(...)   the same contract: worker.kernels.fused_moe.fused_moe (the grouped-GEMM
                       Triton kernel) on CUDA with Triton on, else experts_loop

For token t: out[t] = sum_j topk_weights[t, j] * E_e(x[t]) over its experts e = topk_ids[t, j],
E_e(x) = (silu(x W_gate^T) * (x W_up^T)) W_down^T, with w13[e] = [W_gate; W_up] (gate rows
0..I-1, then up rows) and w2[e] = W_down. Each expert's two GEMMs run in x's dtype (float32
accumulation, as F.linear); the weighted sum accumulates in float32 and is rounded once.

FP8 experts (worker.models.fp8): w13, w2 in float8_e4m3fn with float32 per-output-channel
scales w13_scale [E, 2I] and w2_scale [E, H] (weight ~ data * scale[..., None]); each GEMM's
input is quantized per token (worker.kernels.ops.quantize_fp8_rows) and the product is
(x_q @ W_q^T) * x_scale * w_scale, computed in float32 here (fp8.emulated_fp8_matmul's rule),
rounded to x's dtype.

``route`` is CUDA-graph safe (no host synchronisation); ``experts_loop`` visits only the
experts some token chose (a host synchronisation) except while a CUDA graph is being captured,
when it runs every expert on every token with zero weights for the others.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F

from worker.kernels.ops import Fp8Rows, _kernels_for, _triton, quantize_fp8_rows, silu_and_mul

log = logging.getLogger(__name__)
_WARNED: list[bool] = []


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts in float32, the top-k probabilities (divided by their sum
    when ``renormalize``) and their expert ids."""
    if _kernels_for(router_logits) is not None and router_logits.dim() == 2 and router_logits.stride(-1) == 1:
        from worker.kernels.fused_moe import fused_route

        return fused_route(router_logits, top_k, renormalize)
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def _gemm(x: Any, weight: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x [n, K] (Fp8Rows when the weight is FP8) times weight [N, K]^T, in ``dtype``."""
    if scale is None:
        return F.linear(x, weight)
    rows = x if isinstance(x, Fp8Rows) else quantize_fp8_rows(x)
    product = rows.data.float() @ weight.float().t()
    return (product * rows.scale[:, None] * scale[None, :]).to(dtype)


def _expert(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
) -> torch.Tensor:
    """One expert's gated MLP on rows x [n, H]; one expert's weights (and scales)."""
    gate_up = _gemm(x, w13, w13_scale, x.dtype)
    hidden = silu_and_mul(gate_up, fp8=w2_scale is not None)
    return _gemm(hidden, w2, w2_scale, x.dtype)


def experts_loop(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The experts one at a time (module docstring): the CPU path and the oracle."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return every_expert(x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        token, slot = torch.where(topk_ids == e)
        y = _expert(x[token], w13[e], w2[e], *_scales(e, w13_scale, w2_scale))
        out.index_add_(0, token, y.float() * topk_weights[token, slot, None])
    return out.to(x.dtype)


def every_expert(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """experts_loop's values with no data-dependent shapes (what a CUDA graph can capture):
    every expert on every token, weighted by zero where the token did not choose it."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        weight = (topk_weights * (topk_ids == e)).sum(dim=-1, keepdim=True)
        out += _expert(x, w13[e], w2[e], *_scales(e, w13_scale, w2_scale)).float() * weight
    return out.to(x.dtype)


def _scales(
    e: int, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return (None if w13_scale is None else w13_scale[e]), (None if w2_scale is None else w2_scale[e])


def moe_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    fp8_sums: str = "exact",
) -> torch.Tensor:
    """experts_loop's values: the fused kernel on CUDA when Triton is on (the engine's
    ``triton`` setting) with ``fp8_sums`` its FP8 gate/up arithmetic (fused_moe), else the loop."""
    if x.is_cuda and _triton() is not None:
        try:
            from worker.kernels.fused_moe import fused_moe
        except ImportError as exc:
            if not _WARNED:
                _WARNED.append(True)
                log.warning("fused MoE kernel unavailable (%s): experts run one at a time", exc)
        else:
            return fused_moe(
                x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale, fp8_sums=fp8_sums
            )
    return experts_loop(x, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale)
