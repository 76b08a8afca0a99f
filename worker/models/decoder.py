"""One decoder-only transformer for Llama, Qwen2 and Qwen3; ModelConfig carries the differences.

Every layer works on the flattened tokens of the whole batch, [T, hidden]; attention goes
through ``ForwardBatch.attention`` (paged KV cache + backend). No host synchronisation
happens in ``forward``, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from worker.distributed import all_reduce
from worker.kernels.cpu_linear import linear
from worker.kernels.ops import add_rms_norm, norm_rope, qk_norm_rope_store, rms_norm, silu_and_mul
from worker.models.config import ModelConfig
from worker.models.fp8 import takes_fp8
from worker.models.rope import RotaryEmbedding

if TYPE_CHECKING:
    from worker.forward import ForwardBatch

# HF checkpoint name fragment -> (fused parameter fragment, shard index)
_FUSED_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class RMSNorm(nn.Module):
    """x / rms(x) * weight, normalised in float32 and cast back before the weight (as HF does)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, fp8: bool = False) -> Any:
        """The normed x; quantized per row (worker.kernels.ops.Fp8Rows) with ``fp8``."""
        return rms_norm(x, self.weight, self.eps, fp8=fp8)  # one fused kernel on CUDA


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.rope = rope
        self.tp_size = cfg.tp_size  # > 1: o_proj is row-parallel, its partial sums all-reduced
        self.num_q_heads = cfg.num_q_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_q_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_shard_sizes = (self.q_size, self.kv_size, self.kv_size)
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias, dtype=dtype
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, cfg.o_proj_bias, dtype=dtype)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None

    def forward(self, positions: torch.Tensor, x: Any, batch: ForwardBatch) -> torch.Tensor:
        """x: the normed hidden states, quantized (Fp8Rows) when qkv_proj takes FP8."""
        qkv = self.qkv_proj(x)
        cos, sin = self.rope.cos_cache, self.rope.sin_cache
        q_w = k_w = None
        eps = 0.0
        if self.q_norm is not None and self.k_norm is not None:
            q_w, k_w, eps = self.q_norm.weight, self.k_norm.weight, self.q_norm.eps
        kv, layer = batch.kv, self.layer_id
        # The backend may attend this pass's own K/V as computed (FP8 pool prefill): the kernel
        # then also leaves rope(norm(k)) in new_k; v is read in place from qkv.
        new_k = qkv.new_empty(qkv.shape[0], self.num_kv_heads, self.head_dim) if batch.wants_new_kv else None
        # CUDA: one kernel does qk-norm (Qwen3), rope and this pass's K/V store at out_loc.
        fused_q = qk_norm_rope_store(
            qkv, positions, cos, sin, q_w, k_w, eps, kv.k_buffer(layer), kv.v_buffer(layer), batch.out_loc,
            self.num_q_heads, self.num_kv_heads, kv.k_scale[layer], kv.v_scale[layer], new_k,
        )  # fmt: skip
        if fused_q is not None:
            new_kv = None
            if new_k is not None:
                v_new = qkv[:, self.q_size + self.kv_size :].view(-1, self.num_kv_heads, self.head_dim)
                new_kv = (new_k, v_new)
            out = batch.backend.forward(fused_q, layer, batch.attn_meta, new_kv)
        else:
            q, k, v = qkv.split(self.qkv_shard_sizes, dim=-1)
            q = norm_rope(q.view(-1, self.num_q_heads, self.head_dim), positions, cos, sin, q_w, eps)
            k = norm_rope(k.view(-1, self.num_kv_heads, self.head_dim), positions, cos, sin, k_w, eps)
            out = batch.attention(q, k, v.view(-1, self.num_kv_heads, self.head_dim), layer)
        out = self.o_proj(out.reshape(-1, self.q_size))
        return all_reduce(out) if self.tp_size > 1 else out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.tp_size = cfg.tp_size  # > 1: down_proj is row-parallel, its partial sums all-reduced
        self.gate_up_shard_sizes = (cfg.intermediate_size, cfg.intermediate_size)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, False, dtype=dtype)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, False, dtype=dtype)

    def forward(self, x: Any) -> torch.Tensor:
        """x: the normed hidden states, quantized (Fp8Rows) when gate_up_proj takes FP8."""
        out = self.down_proj(silu_and_mul(self.gate_up_proj(x), fp8=takes_fp8(self.down_proj)))
        return all_reduce(out) if self.tp_size > 1 else out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer_id, rope, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(
        self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer input is ``h + residual`` (just ``h`` when residual is None); returns
        (mlp output, residual) unsummed, so the next norm fuses the add."""
        norm, fp8 = self.input_layernorm, takes_fp8(self.self_attn.qkv_proj)
        if residual is None:
            residual, normed = h, norm(h, fp8=fp8)
        else:
            normed, residual = add_rms_norm(h, residual, norm.weight, norm.eps, fp8=fp8)
        attn = self.self_attn(positions, normed, batch)
        norm, fp8 = self.post_attention_layernorm, takes_fp8(self.mlp.gate_up_proj)
        normed, residual = add_rms_norm(attn, residual, norm.weight, norm.eps, fp8=fp8)
        return self.mlp(normed), residual


class DecoderBody(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rope, dtype) for i in range(cfg.num_layers))
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

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, rope_device: torch.device | str) -> None:
        super().__init__()
        self.config = cfg
        self.rope = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, rope_device
        )
        self.model = DecoderBody(cfg, self.rope, dtype)
        # Tied embeddings: no lm_head module, the embedding matrix is the output projection.
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else nn.Linear(cfg.hidden_size, cfg.vocab_size, False, dtype=dtype)
        )

    def forward(self, batch: ForwardBatch, logits_out: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, vocab] in the model dtype for the tokens at ``batch.sample_idx``; written
        into ``logits_out`` ([B, vocab]) when given (CUDA graphs: one buffer for every size)."""
        positions = batch.positions
        h, residual = self.model.embed_tokens(batch.input_ids), None
        for layer in self.model.layers:
            h, residual = layer(positions, h, residual, batch)
        idx, norm = batch.sample_idx, self.model.norm
        if residual is None:
            h = norm(h[idx])
        else:  # the last layer's residual add, fused into the final norm of the sampled rows
            h, _ = add_rms_norm(h[idx], residual[idx], norm.weight, norm.eps)
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if logits_out is not None:
            return torch.mm(h, weight.t(), out=logits_out)
        return linear(h, weight)  # oneDNN on CPU (worker.kernels.cpu_linear)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF-named tensors into the parameters (concatenating fused shards).

        Returns the names of the parameters written; unknown checkpoint names raise.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            target, offset, size = name, 0, None
            for fragment, (fused, shard) in _FUSED_SHARDS.items():
                if f".{fragment}." in name:
                    target = name.replace(f".{fragment}.", f".{fused}.")
                    sizes = self._shard_sizes(target)
                    offset, size = sum(sizes[:shard]), sizes[shard]
                    break
            if target not in params:
                raise KeyError(f"checkpoint tensor {name!r} has no matching model parameter")
            param = params[target]
            dest = param.data if size is None else param.data.narrow(0, offset, size)
            if dest.shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}"
                )
            dest.copy_(tensor)
            loaded.add(name if size is None else f"{target}#{offset}")
        return loaded

    def _shard_sizes(self, fused_name: str) -> tuple[int, ...]:
        module = self.get_submodule(fused_name.rsplit(".", 2)[0])
        if isinstance(module, Attention):
            return module.qkv_shard_sizes
        assert isinstance(module, MLP), f"{fused_name} is not a fused projection"
        return module.gate_up_shard_sizes

    def expected_weight_keys(self) -> set[str]:
        """The keys ``load_weights`` must report for a complete checkpoint."""
        keys: set[str] = set()
        for name, _ in self.named_parameters():
            if ".qkv_proj." in name or ".gate_up_proj." in name:
                sizes = self._shard_sizes(name)
                keys.update(f"{name}#{sum(sizes[:i])}" for i in range(len(sizes)))
            else:
                keys.add(name)
        return keys
