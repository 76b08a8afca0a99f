"""The decoder every family builds on: ``CausalLM`` (embedding, layers, final norm, LM head)
and the pre-norm ``DecoderLayer`` of Llama-like models.

A family (worker.models.families) is a CausalLM subclass: ``config_from_hf`` reads its
ModelConfig, ``weight_map`` names its checkpoint tensors (worker.models.weights), and it
overrides only what differs: ``make_layer`` (Gemma's pre/post-norm layer), ``embed`` (Gemma's
scaled embedding). ``make_mlp`` gives the layers that ``ModelConfig.moe`` lists the sparse MoE
block (worker.models.moe), the others the gated MLP.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from worker.kernels.cpu_linear import linear
from worker.kernels.ops import add_rms_norm
from worker.models.config import HfSource, ModelConfig, base_fields
from worker.models.fp8 import takes_fp8
from worker.models.layers import Attention, GatedMLP, RMSNorm
from worker.models.moe import SparseMoE
from worker.models.rope import RotaryEmbedding
from worker.models.weights import WeightMap, load_pieces, piece_table

if TYPE_CHECKING:
    from worker.forward import ForwardBatch


def input_norm(
    norm: RMSNorm, h: torch.Tensor, residual: torch.Tensor | None, fp8: bool
) -> tuple[Any, torch.Tensor]:
    """(norm(h + residual), h + residual) of a layer's input (h alone when residual is None,
    the first layer); the norm quantized per row (Fp8Rows) with ``fp8``."""
    if residual is None:
        return norm(h, fp8=fp8), h
    return add_rms_norm(h, residual, norm.weight, norm.eps, fp8=fp8)


class DecoderLayer(nn.Module):
    """h + attn(norm(h)), then + mlp(norm(.)), with the residual adds fused into the norms."""

    def __init__(
        self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding, dtype: torch.dtype, mlp: nn.Module
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer_id, rope, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = mlp

    def forward(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer input is ``h + residual`` (just ``h`` when residual is None); returns
        (mlp output, residual) unsummed, so the next norm fuses the add."""
        normed, residual = input_norm(self.input_layernorm, h, residual, takes_fp8(self.self_attn.qkv_proj))
        attn = self.self_attn(positions, normed, batch)
        norm, fp8 = self.post_attention_layernorm, takes_fp8(getattr(self.mlp, "gate_up_proj", None))
        normed, residual = add_rms_norm(attn, residual, norm.weight, norm.eps, fp8=fp8)
        return self.mlp(normed), residual


class DecoderBody(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, layers: Iterable[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)


class CausalLM(nn.Module):
    """Decoder + LM head. Parameter names follow HF, except the fused qkv_proj / gate_up_proj.

    With ``cfg.tp_size`` > 1 (a ModelConfig.shard) it is one rank's share: q/k/v and gate/up
    column-parallel (this rank's heads and intermediate rows), o_proj and down_proj
    row-parallel, all-reduced; embedding, norms and lm_head replicated. ``load_weights``
    takes the rank's slices (worker.models.loader.rank_shard).

    ``rope_device`` is where the rotary tables live: the model's device (the module itself
    may be built on the meta device and materialised later).
    """

    weight_map: ClassVar[WeightMap] = WeightMap()

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, rope_device: torch.device | str) -> None:
        super().__init__()
        self.config = cfg
        self.rope = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, rope_device,
            cfg.rotary_dim,
        )  # fmt: skip
        self.sliding_rope = self.rope
        if cfg.sliding_rope_theta:
            self.sliding_rope = RotaryEmbedding(
                cfg.head_dim, cfg.max_position_embeddings, cfg.sliding_rope_theta, None, rope_device,
                cfg.rotary_dim,
            )  # fmt: skip
        self.model = DecoderBody(cfg, dtype, (self.make_layer(cfg, i, dtype) for i in range(cfg.num_layers)))
        # Tied embeddings: no lm_head module, the embedding matrix is the output projection.
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, False, dtype=dtype)
        )

    @classmethod
    def config_from_hf(cls, src: HfSource) -> ModelConfig:
        """This family's ModelConfig from the HF config (worker.models.config.base_fields)."""
        return ModelConfig(**base_fields(src))

    def rope_of(self, layer_id: int) -> RotaryEmbedding:
        """The rotary tables of layer ``layer_id``: sliding-window layers may have their own."""
        return self.sliding_rope if self.config.attention_of(layer_id).sliding_window else self.rope

    def make_layer(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> nn.Module:
        return DecoderLayer(cfg, layer_id, self.rope_of(layer_id), dtype, self.make_mlp(cfg, layer_id, dtype))

    def make_mlp(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype) -> nn.Module:
        """The layer's MLP: the sparse MoE block in cfg.moe's layers, else the gated MLP."""
        if cfg.moe is not None and layer_id in cfg.moe.layers:
            return SparseMoE(cfg, dtype)
        return GatedMLP(cfg, cfg.intermediate_size, dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, batch: ForwardBatch, logits_out: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, vocab] in the model dtype for the tokens at ``batch.sample_idx``; written
        into ``logits_out`` ([B, vocab]) when given (CUDA graphs: one buffer for every size)."""
        positions = batch.positions
        h, residual = self.embed(batch.input_ids), None
        for layer in self.model.layers:
            h, residual = layer(positions, h, residual, batch)
        return self.head(h, residual, batch.sample_idx, logits_out)

    def forward_split(self, halves: list[ForwardBatch]) -> torch.Tensor:
        """Logits [B, vocab] of a decode pass cut in halves (worker.engine.split), their rows in
        order: the halves' layers interleave, layer by layer, each half's kernels on its lanes
        (attention on one stream, the rest on another), so one half's attention may run beside
        the other's GEMMs; then the final norm and LM head over every row."""
        states: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for batch in halves:
            assert batch.lanes is not None
            with batch.lanes.on("gemm"):
                states.append((self.embed(batch.input_ids), None))
        for layer in self.model.layers:
            for i, batch in enumerate(halves):
                assert batch.lanes is not None
                with batch.lanes.on("gemm"):
                    states[i] = layer(batch.positions, *states[i], batch)
        for batch in halves:
            assert batch.lanes is not None
            batch.lanes.join()
        h = torch.cat([state[0] for state in states])
        residuals = [state[1] for state in states if state[1] is not None]
        residual = torch.cat(residuals) if residuals else None  # None: a model without layers
        return self.head(h, residual, torch.arange(h.shape[0], device=h.device))

    def head(
        self,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        idx: torch.Tensor,
        logits_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The final norm (with the last residual add) and the LM head of rows ``idx``."""
        norm = self.model.norm
        if residual is None:
            h = norm(h[idx])
        else:  # the last layer's residual add, fused into the final norm of the sampled rows
            h, _ = add_rms_norm(h[idx], residual[idx], norm.weight, norm.eps)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if logits_out is not None:
            logits = torch.mm(h, weight.t(), out=logits_out)
        else:
            logits = linear(h, weight)  # oneDNN on CPU (worker.kernels.cpu_linear)
        cap = self.config.final_logit_softcap
        if cap:  # in place: logits_out stays the output
            logits.div_(cap).tanh_().mul_(cap)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy canonical (name, tensor) pairs (worker.models.weights: the family's
        ``weight_map`` makes them from a checkpoint) into the parameters, fused and stacked
        ones included. Returns the names written; unknown names raise."""
        tied = frozenset({"lm_head.weight"}) if self.lm_head is None else frozenset()
        return load_pieces(self, weights, ignore=tied)

    def expected_weight_keys(self) -> set[str]:
        """The canonical names ``load_weights`` must report for a complete checkpoint."""
        return set(piece_table(self))
