"""Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention (q/k norms), a sparse MLP in
the layers ``decoder_sparse_step`` and ``mlp_only_layers`` select (the others dense with
``intermediate_size``), router softmax then top-k, renormalised when ``norm_topk_prob``;
checkpoint experts as ``mlp.experts.{e}.{gate,up,down}_proj`` (canonical already) or fused
(transformers 5's ``mlp.experts.gate_up_proj`` / ``down_proj``: split at load)."""

from __future__ import annotations

from worker.models.config import HfSource, ModelConfig, MoEConfig, base_fields
from worker.models.decoder import CausalLM


class Qwen3MoeForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        hf = src.hf
        num_experts = int(getattr(hf, "num_experts", None) or hf.num_local_experts)
        step, dense = int(hf.decoder_sparse_step), set(hf.mlp_only_layers or ())
        sparse = tuple(
            i
            for i in range(hf.num_hidden_layers)
            if i not in dense and num_experts > 0 and (i + 1) % step == 0
        )
        moe = MoEConfig(
            num_experts=num_experts,
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.moe_intermediate_size),
            renormalize=bool(hf.norm_topk_prob),
            layers=sparse,
        )
        return ModelConfig(**{**base_fields(src), "qk_norm": True, "moe": moe})
