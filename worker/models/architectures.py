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
# quantization_config.quant_method -> what loads it. NOTE: the hook for checkpoints published
# quantized (FP8); none is taken yet, so every quantization_config is refused by name.
QUANTIZATION_METHODS: dict[str, str] = {}


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


def check_quantization(raw: dict[str, Any], where: str) -> None:
    """Refuse a checkpoint published quantized in a scheme radixq cannot run."""
    quant = raw.get("quantization_config") or (raw.get("text_config") or {}).get("quantization_config")
    if not quant:
        return
    method = str(quant.get("quant_method", "unknown")) if isinstance(quant, dict) else str(quant)
    if method not in QUANTIZATION_METHODS:
        supported = ", ".join(QUANTIZATION_METHODS) or "none yet"
        raise UnsupportedModel(
            f"{where}: quantization_config quant_method {method!r} is not supported (checkpoints "
            f"quantized as published: {supported}; radixq quantizes bf16 weights itself with "
            'quantization = "fp8")'
        )


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
