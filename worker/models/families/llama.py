"""Llama (SmolLM2, Llama 3.x): the plain decoder; attention_bias puts a bias on q, k, v and o."""

from __future__ import annotations

from worker.models.config import HfSource, ModelConfig, base_fields
from worker.models.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        fields = base_fields(src)
        return ModelConfig(**{**fields, "o_proj_bias": fields["attention_bias"]})
