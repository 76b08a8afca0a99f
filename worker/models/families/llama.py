"""Llama (SmolLM2, Llama 3.x): the plain decoder; attention_bias puts a bias on q, k, v and o."""

from __future__ import annotations

from worker.models.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    """Nothing to override: base_fields reads everything, the checkpoint names are canonical."""
