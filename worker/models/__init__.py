"""Models: config, decoder, weight loading and tokenizer helpers (re-exported lazily: the
torch-free ``worker.models.names`` imports no torch)."""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.models.config import ModelConfig
    from worker.models.decoder import CausalLM
    from worker.models.loader import LoadedModel, load_model
    from worker.models.registry import DEFAULT_MODEL

__all__ = ["DEFAULT_MODEL", "CausalLM", "LoadedModel", "ModelConfig", "load_model"]
__getattr__ = lazy_exports(
    __name__,
    {
        "ModelConfig": "worker.models.config",
        "CausalLM": "worker.models.decoder",
        "LoadedModel": "worker.models.loader",
        "load_model": "worker.models.loader",
        "DEFAULT_MODEL": "worker.models.registry",
    },
)
