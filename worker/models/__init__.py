"""Models: config, decoder, weight loading and tokenizer helpers."""

from worker.models.config import ModelConfig
from worker.models.decoder import CausalLM
from worker.models.loader import LoadedModel, load_model
from worker.models.registry import DEFAULT_MODEL

__all__ = ["DEFAULT_MODEL", "CausalLM", "LoadedModel", "ModelConfig", "load_model"]
