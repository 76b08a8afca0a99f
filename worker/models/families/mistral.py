"""Mistral (7B v0.1-v0.3, Nemo, Small): Llama's decoder, with a sliding window on every
layer where config.json sets ``sliding_window`` (worker.models.config.sliding_windows)."""

from __future__ import annotations

from worker.models.decoder import CausalLM


class MistralForCausalLM(CausalLM):
    """Nothing to override: base_fields reads the window, the checkpoint names are Llama's."""
