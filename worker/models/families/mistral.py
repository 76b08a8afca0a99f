"""Mistral (7B v0.1-v0.3, Nemo, Small): Llama's decoder without biases, with a sliding window
on every layer where config.json sets ``sliding_window`` (worker.models.config.sliding_windows)."""

from __future__ import annotations

from worker.models.config import HfSource, ModelConfig, base_fields
from worker.models.decoder import CausalLM


class MistralForCausalLM(CausalLM):
    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        return ModelConfig(**base_fields(src, biases=False))
