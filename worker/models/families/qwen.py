"""Qwen2 / Qwen2.5 (bias on q, k, v, none on o) and Qwen3 (per-head q/k RMSNorm; its
attention_bias, false in published configs, covers q, k, v and o)."""

from __future__ import annotations

from worker.models.config import HfSource, ModelConfig, base_fields
from worker.models.decoder import CausalLM


class Qwen2ForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        return ModelConfig(**{**base_fields(src), "attention_bias": True, "o_proj_bias": False})


class Qwen3ForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        return ModelConfig(**{**base_fields(src), "qk_norm": True})
