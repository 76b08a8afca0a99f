"""Which Hugging Face checkpoints radixq runs, torch-free: the architecture registry and the
checks a config.json must pass before anything loads (worker.preflight runs them before a
Redis or an engine starts; worker.models.config runs them again when the model loads).

``ARCHITECTURES`` maps each HF ``architectures`` name to the CausalLM subclass that runs it
(``module:Class``, imported only when chosen: worker.models.families.model_class).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from worker.models.checkpoint_quant import Fp8Scheme, parse_quantization

ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "worker.models.families.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "worker.models.families.qwen:Qwen2ForCausalLM",
    "Qwen3ForCausalLM": "worker.models.families.qwen:Qwen3ForCausalLM",
    "MistralForCausalLM": "worker.models.families.mistral:MistralForCausalLM",
    "Gemma2ForCausalLM": "worker.models.families.gemma2:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "worker.models.families.gemma3:Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration": "worker.models.families.gemma3:Gemma3ForConditionalGeneration",
    "Phi3ForCausalLM": "worker.models.families.phi3:Phi3ForCausalLM",
    "Qwen3MoeForCausalLM": "worker.models.families.qwen3_moe:Qwen3MoeForCausalLM",
    "MixtralForCausalLM": "worker.models.families.mixtral:MixtralForCausalLM",
}
# config.json without ``architectures``: its ``model_type`` names the architecture.
MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "phi3": "Phi3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)


class UnsupportedModel(ValueError):
    """A config.json radixq cannot run; ``str()`` is one line naming what and the choices."""


def architecture_of(raw: dict[str, Any], where: str) -> str:
    """The architecture of a parsed config.json (``where`` names it in errors), checked."""
    archs = raw.get("architectures") or [MODEL_TYPES.get(str(raw.get("model_type", "")), "")]
    arch = str(archs[0]) if archs else ""
    if arch not in ARCHITECTURES:
        shown = arch or f"model_type {raw.get('model_type')!r}"
        raise UnsupportedModel(
            f"{where}: architecture {shown!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def quantization_config(raw: dict[str, Any]) -> Any:
    """A parsed config.json's ``quantization_config`` (its ``text_config``'s for image-text
    checkpoints); None when it has none."""
    return raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")


def check_quantization(raw: dict[str, Any], where: str) -> Fp8Scheme | None:
    """The FP8 scheme of a checkpoint published quantized (None: not quantized); a scheme
    radixq cannot run is refused (worker.models.checkpoint_quant)."""
    quant = quantization_config(raw)
    if not quant:
        return None
    try:
        return parse_quantization(quant)
    except ValueError as exc:
        raise UnsupportedModel(f"{where}: quantization_config {exc}") from None


def check_config_file(file: str | Path) -> str:
    """Read a config.json and run both checks; returns the architecture."""
    file = Path(file)
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"{file}: not a readable config.json ({exc})") from None
    if not isinstance(raw, dict):
        raise UnsupportedModel(f"{file}: config.json is not a JSON object")
    arch = architecture_of(raw, str(file))
    check_quantization(raw, str(file))
    return arch
