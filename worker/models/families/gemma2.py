"""Gemma 2: a norm before and after both attention and MLP, (1 + w) RMSNorm, GeGLU (tanh
GELU), the embedding scaled by sqrt(hidden), tied embeddings, sliding-window layers where
``layer_types`` says (every other one), attention-logit and final-logit soft-capping,
``query_pre_attn_scalar ** -0.5`` as the attention scale."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from worker.kernels.ops import add_rms_norm
from worker.models.config import HfSource, LayerAttention, ModelConfig, base_fields, sliding_windows
from worker.models.decoder import CausalLM, input_norm
from worker.models.fp8 import takes_fp8
from worker.models.layers import Attention, GatedMLP, RMSNorm
from worker.models.rope import RotaryEmbedding
from worker.models.weights import WeightMap

if TYPE_CHECKING:
    from worker.forward import ForwardBatch


def plus_one(weight: torch.Tensor, _: ModelConfig) -> torch.Tensor:
    """Gemma's norm weight w as the plain RMSNorm weight 1 + w (in float32, then the dtype)."""
    return (weight.float() + 1.0).to(weight.dtype)


GEMMA_NORMS = (r"norm\.weight$", plus_one)


class GemmaDecoderLayer(nn.Module):
    """h + post_norm(attn(norm(h))), then + post_ff_norm(mlp(pre_ff_norm(.)))."""

    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        size, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps, dtype)
        self.self_attn = Attention(cfg, layer_id, rope, dtype)
        self.post_attention_layernorm = RMSNorm(size, eps, dtype)
        self.pre_feedforward_layernorm = RMSNorm(size, eps, dtype)
        self.mlp = GatedMLP(cfg, cfg.intermediate_size, dtype)
        self.post_feedforward_layernorm = RMSNorm(size, eps, dtype)

    def forward(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DecoderLayer's contract: input h + residual, returns (output, residual) unsummed."""
        normed, residual = input_norm(self.input_layernorm, h, residual, takes_fp8(self.self_attn.qkv_proj))
        attn = self.post_attention_layernorm(self.self_attn(positions, normed, batch))
        norm, fp8 = self.pre_feedforward_layernorm, takes_fp8(self.mlp.gate_up_proj)
        normed, residual = add_rms_norm(attn, residual, norm.weight, norm.eps, fp8=fp8)
        return self.post_feedforward_layernorm(self.mlp(normed)), residual


def gemma_fields(src: HfSource, hf: object) -> dict:
    """What Gemma 2 and 3 read alike: base_fields, then GeGLU, the soft-caps, the scale and
    the windows of ``layer_types``."""
    if getattr(hf, "use_bidirectional_attention", False):
        raise ValueError(
            f"{src.file}: use_bidirectional_attention=true (an embedding model) is not supported"
        )
    attn_cap = float(getattr(hf, "attn_logit_softcapping", None) or 0.0)
    scale = float(hf.query_pre_attn_scalar) ** -0.5  # type: ignore[attr-defined]
    layers = tuple(LayerAttention(w, attn_cap, scale) for w in sliding_windows(hf))
    return {
        **base_fields(src, hf),
        "hidden_act": hf.hidden_activation,  # type: ignore[attr-defined]
        "final_logit_softcap": float(getattr(hf, "final_logit_softcapping", None) or 0.0),
        "layer_attention": layers,
    }


class Gemma2ForCausalLM(CausalLM):
    weight_map = WeightMap(transforms=(GEMMA_NORMS,))

    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        return ModelConfig(**gemma_fields(src, src.hf))

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, rope_device: torch.device | str) -> None:
        super().__init__(cfg, dtype, rope_device)
        # sqrt(hidden_size) rounded to the model dtype, as transformers multiplies by it
        self.embed_scale = float(torch.tensor(math.sqrt(cfg.hidden_size), dtype=dtype, device="cpu"))

    def make_layer(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> nn.Module:
        return GemmaDecoderLayer(cfg, layer_id, self.rope_of(layer_id), dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids) * self.embed_scale
