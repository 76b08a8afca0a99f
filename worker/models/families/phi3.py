"""Phi-3.x and Phi-4 (Phi3ForCausalLM): Llama's decoder with q/k/v and gate/up fused in the
checkpoint (``qkv_proj``, ``gate_up_proj``: split to canonical names by
worker.models.weights.split_fused), "longrope" scaling (worker.models.rope), a sliding window
where config.json sets one, and partial rotary (Phi-4-mini's ``partial_rotary_factor``).

longrope: radixq rotates positions below ``original_max_position_embeddings`` with the short
factors and positions from there on with the long ones, each position by its own table, so
the KV cache stays valid as a sequence grows. transformers instead switches the whole
sequence to the long factors once it is longer than the original context (recomputing
earlier positions, though keys already in its cache keep their short rotation); the two agree
exactly below the original length (4,096 tokens for Phi-3-mini-4k; Phi-4's 16k config has no
rope scaling) and differ by the early positions' rotation past it.
"""

from __future__ import annotations

import torch

from worker.models.config import HfSource, ModelConfig, base_fields
from worker.models.decoder import CausalLM
from worker.models.rope import rotary_permutation
from worker.models.weights import WeightMap


def rotary_rows(weight: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """q_proj / k_proj rows (bias, FP8 scales) reordered within each head for partial rotary (rope.py)."""
    if not cfg.rotary_dim:
        return weight
    perm = rotary_permutation(cfg.head_dim, cfg.rotary_dim)
    heads = weight.view(-1, cfg.head_dim, *weight.shape[1:])
    return heads[:, perm].reshape(weight.shape)


class Phi3ForCausalLM(CausalLM):
    weight_map = WeightMap(transforms=((r"\.(q_proj|k_proj)\.(weight|bias|weight_scale)$", rotary_rows),))

    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        return ModelConfig(**base_fields(src, biases=False))
