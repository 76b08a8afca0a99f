"""One module per model family; worker.models.architectures names which class runs which
Hugging Face architecture, and ``model_class`` imports it when it is chosen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import load_callable
from worker.models.architectures import ARCHITECTURES

if TYPE_CHECKING:
    from worker.models.decoder import CausalLM


def model_class(architecture: str) -> type[CausalLM]:
    """The CausalLM subclass that runs ``architecture`` (a key of ARCHITECTURES)."""
    return load_callable(architecture, ARCHITECTURES, "architecture")  # type: ignore[return-value]
