"""Mixtral (8x7B, 8x22B): Mistral's attention, every MLP sparse: router softmax, top-k,
always renormalised over the chosen experts; experts of ``intermediate_size``. Checkpoint
names ``block_sparse_moe.gate`` and ``block_sparse_moe.experts.{e}.w1/w3/w2`` (gate/up/down)
become the canonical ``mlp.gate`` and ``mlp.experts.{e}.{gate,up,down}_proj``."""

from __future__ import annotations

from worker.models.config import HfSource, ModelConfig, MoEConfig, base_fields
from worker.models.decoder import CausalLM
from worker.models.weights import WeightMap


class MixtralForCausalLM(CausalLM):
    weight_map = WeightMap(
        renames=(
            (r"\.block_sparse_moe\.", ".mlp."),
            (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
            (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
            (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj."),
        )
    )

    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        hf = src.hf
        moe = MoEConfig(
            num_experts=int(hf.num_local_experts),
            top_k=int(hf.num_experts_per_tok),
            intermediate_size=int(hf.intermediate_size),
            renormalize=True,
            layers=tuple(range(hf.num_hidden_layers)),
        )
        return ModelConfig(**{**base_fields(src, biases=False), "moe": moe})
