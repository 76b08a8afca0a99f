"""The benchmark configs of the newer families carry the published shapes: transformers builds
each model from its configs/*.json on the meta device (no weights) and the parameter count is
the one its model card publishes, with the fields the benchmarks and floors read checked by name.
(The Llama / Qwen3 configs: tests/unit/test_models.py test_bundled_configs.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]

# config -> (published parameter count, the exact count where the card gives one, fields)
PUBLISHED = {
    "qwen3-30b-a3b": (30.5e9, None, dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768)),
    "mixtral-8x7b": (46.7e9, 46_702_792_704, dict(num_local_experts=8, num_experts_per_tok=2)),
    "mistral-7b-v0.3": (7.25e9, 7_248_023_552, dict(vocab_size=32768, sliding_window=None)),
    "gemma-3-12b": (12.2e9, None, dict(sliding_window=1024, head_dim=256, num_hidden_layers=48)),
    "phi-4": (14.7e9, 14_659_507_200, dict(num_key_value_heads=10, intermediate_size=17920)),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_config_builds_the_published_model(name: str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    total, exact, fields = PUBLISHED[name]
    config = AutoConfig.from_pretrained(REPO / "configs" / f"{name}.json")
    text = config.get_text_config()
    for field, value in fields.items():
        assert getattr(text, field) == value, field
    # Gemma 3 12B ships as Gemma3ForConditionalGeneration (the vision tower counts in its 12.2B)
    auto = AutoModelForImageTextToText if "text_config" in json.loads(
        (REPO / "configs" / f"{name}.json").read_text()
    ) else AutoModelForCausalLM  # fmt: skip
    with torch.device("meta"):
        model = auto.from_config(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == exact if exact else count == pytest.approx(total, rel=5e-3)
