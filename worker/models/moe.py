"""The sparse MLP block of MoE families (Qwen3-MoE, Mixtral): a router and stacked experts.

    gate   nn.Linear(hidden, E), no bias: the router's logits
    w13    [E, 2I, H]: each expert's gate rows (0..I-1) then up rows
    w2     [E, H, I]: each expert's down projection
    (FP8: w13/w2 in e4m3 with w13_scale [E, 2I], w2_scale [E, H]; worker.models.fp8)

``forward`` routes (worker.kernels.moe.route) and runs the experts
(worker.kernels.moe.moe_experts: the fused kernel on CUDA, the expert loop elsewhere);
``fp8_sums`` is the fused kernel's FP8 gate/up arithmetic (the engine option ``moe_fp8_sums``,
set by worker.engine.engine after loading). Under
tensor parallelism each rank holds every expert's share of the intermediate rows (I / tp)
and the partial sums are all-reduced; the router is replicated.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.distributed import all_reduce
from worker.kernels.moe import moe_experts, route
from worker.models.config import ModelConfig
from worker.models.weights import Piece


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        moe = cfg.moe
        assert moe is not None, "SparseMoE needs ModelConfig.moe"
        self.num_experts, self.top_k, self.renormalize = moe.num_experts, moe.top_k, moe.renormalize
        self.intermediate_size = moe.intermediate_size
        self.tp_size = cfg.tp_size
        hidden, inter = cfg.hidden_size, moe.intermediate_size
        self.gate = nn.Linear(hidden, moe.num_experts, False, dtype=dtype)
        self.w13 = nn.Parameter(torch.empty(moe.num_experts, 2 * inter, hidden, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(moe.num_experts, hidden, inter, dtype=dtype))
        self.w13_scale: nn.Parameter | None
        self.w2_scale: nn.Parameter | None
        self.register_parameter("w13_scale", None)  # FP8 only (quantize_fp8)
        self.register_parameter("w2_scale", None)
        self.fp8_sums = "exact"  # fused_moe's own default; an Engine sets its moe_fp8_sums

    def weight_pieces(self) -> dict[str, Piece]:
        inter, pieces = self.intermediate_size, {}
        for e in range(self.num_experts):
            pieces[f"experts.{e}.gate_proj.weight"] = Piece("w13", e, 0, inter)
            pieces[f"experts.{e}.up_proj.weight"] = Piece("w13", e, inter, inter)
            pieces[f"experts.{e}.down_proj.weight"] = Piece("w2", e)
        return pieces

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: the normed hidden states [T, H] in the model dtype."""
        topk_weights, topk_ids = route(self.gate(x), self.top_k, self.renormalize)
        out = moe_experts(
            x, self.w13, self.w2, topk_weights, topk_ids,
            w13_scale=self.w13_scale, w2_scale=self.w2_scale, fp8_sums=self.fp8_sums,
        )  # fmt: skip
        return all_reduce(out) if self.tp_size > 1 else out

    def set_fp8(
        self, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor
    ) -> None:
        """Replace the experts' weights by FP8 ones with their per-output-channel scales."""
        self.w13 = nn.Parameter(w13, requires_grad=False)
        self.w13_scale = nn.Parameter(w13_scale, requires_grad=False)
        self.w2 = nn.Parameter(w2, requires_grad=False)
        self.w2_scale = nn.Parameter(w2_scale, requires_grad=False)

    def extra_repr(self) -> str:
        fp8 = ", fp8 e4m3 per-channel" if self.w13_scale is not None else ""
        return f"experts={self.num_experts}, top_k={self.top_k}, intermediate={self.intermediate_size}{fp8}"
