"""Gemma 3 (text): Gemma 2's layer (worker.models.families.gemma2) with per-head q/k norms,
sliding and global layers interleaved by ``layer_types`` each with their own rope (sliding:
``rope_local_base_freq``, unscaled; global: ``rope_theta`` and its scaling), usually no
soft-caps. Also the text part of ``Gemma3ForConditionalGeneration`` checkpoints (4B-27B ship
so): its ``text_config``, the ``language_model`` weights as published
(``language_model.model.*``) or as transformers 5 saves them (``model.language_model.*``);
the vision tower is not loaded, and jobs with image content are refused (text-only messages:
wire.schema)."""

from __future__ import annotations

from worker.models.config import HfSource, ModelConfig, eos_ids, rope_of
from worker.models.families.gemma2 import GEMMA_NORMS, Gemma2ForCausalLM, gemma_fields
from worker.models.weights import WeightMap


def gemma3_config(src: HfSource, hf: object) -> ModelConfig:
    rope = getattr(hf, "rope_parameters", None) or {}  # {"full_attention": {...}, "sliding_attention": {...}}
    if "full_attention" in rope:
        theta, scaling = rope_of(rope["full_attention"])
        sliding_theta, sliding_scaling = rope_of(rope["sliding_attention"])
    else:  # transformers 4.x keeps them as attributes
        theta, scaling = float(hf.rope_theta), getattr(hf, "rope_scaling", None)  # type: ignore[attr-defined]
        sliding_theta, sliding_scaling = float(hf.rope_local_base_freq), None  # type: ignore[attr-defined]
    if sliding_scaling is not None:
        raise ValueError(f"{src.file}: rope scaling on sliding-window layers is not supported")
    fields = gemma_fields(src, hf)
    fields.update(rope_theta=theta, rope_scaling=scaling, sliding_rope_theta=sliding_theta, qk_norm=True)
    return ModelConfig(**fields)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        return gemma3_config(src, src.hf)


class Gemma3ForConditionalGeneration(Gemma2ForCausalLM):
    weight_map = WeightMap(
        renames=(
            (r"^language_model\.model\.", "model."),
            (r"^model\.language_model\.", "model."),
            (r"^language_model\.lm_head\.", "lm_head."),
        ),
        skips=(r"^(model\.)?(vision_tower|multi_modal_projector)\.",),
        transforms=(GEMMA_NORMS,),
    )

    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        text = src.hf.text_config
        config = gemma3_config(src, text)
        raw_text = src.raw.get("text_config") or {}
        return ModelConfig(**{
            **config.__dict__,
            "eos_token_ids": eos_ids(src, raw_text.get("eos_token_id")),
            "tie_word_embeddings": bool(getattr(src.hf, "tie_word_embeddings", True)),
        })  # fmt: skip
