"""The layers every family builds from: RMSNorm, attention (with its options), the gated MLP.

Each layer works on the flattened tokens of the whole batch, [T, hidden]; attention goes
through ``ForwardBatch.attention`` (paged KV cache + backend). No host synchronisation
happens in ``forward``, so it can be captured in a CUDA graph. Parameters are fused where the
kernels want them fused (``qkv_proj``, ``gate_up_proj``); ``weight_pieces`` tells the loader
(worker.models.weights) which canonical checkpoint tensor fills which rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from worker.distributed import all_reduce
from worker.kernels.ops import act_and_mul, norm_rope, qk_norm_rope_store, rms_norm
from worker.models.config import ModelConfig
from worker.models.fp8 import takes_fp8
from worker.models.rope import RotaryEmbedding
from worker.models.weights import Piece

if TYPE_CHECKING:
    from worker.forward import ForwardBatch


class RMSNorm(nn.Module):
    """x / rms(x) * weight, normalised in float32 and cast back before the weight (as HF's
    Llama does). Gemma's ``x / rms(x) * (1 + w)`` is this with ``1 + w`` as the weight: its
    families add the 1 when they load (WeightMap transforms), so the fused kernels serve both."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, fp8: bool = False) -> Any:
        """The normed x; quantized per row (worker.kernels.ops.Fp8Rows) with ``fp8``."""
        return rms_norm(x, self.weight, self.eps, fp8=fp8)  # one fused kernel on CUDA


class Attention(nn.Module):
    """q/k/v projection (bias per cfg.attention_bias), optional per-head q/k RMSNorm (Qwen3,
    Gemma 3), rotary embedding ``rope`` (per layer: Gemma 3's sliding layers have their own),
    paged attention as ``cfg.attention_of(layer_id)`` says (the backend reads it), o_proj.

    With cfg.tp_size > 1 it holds this rank's heads; o_proj is row-parallel, all-reduced."""

    def __init__(self, cfg: ModelConfig, layer_id: int, rope: RotaryEmbedding, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.rope = rope
        self.tp_size = cfg.tp_size
        self.num_q_heads = cfg.num_q_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_q_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias, dtype=dtype
        )
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, cfg.o_proj_bias, dtype=dtype)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype) if cfg.qk_norm else None

    def weight_pieces(self) -> dict[str, Piece]:
        sizes = {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size}
        pieces: dict[str, Piece] = {}
        for leaf in ("weight", "bias") if self.qkv_proj.bias is not None else ("weight",):
            offset = 0
            for name, rows in sizes.items():
                pieces[f"{name}.{leaf}"] = Piece(f"qkv_proj.{leaf}", None, offset, rows)
                offset += rows
        return pieces

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
        # CUDA: one kernel does qk-norm, rope and this pass's K/V store at out_loc.
        fused_q = qk_norm_rope_store(
            qkv, positions, cos, sin, q_w, k_w, eps, kv.k_buffer(layer), kv.v_buffer(layer), batch.out_loc,
            self.num_q_heads, self.num_kv_heads, kv.k_scale[layer], kv.v_scale[layer], new_k,
        )  # fmt: skip
        if fused_q is not None:
            new_kv = None
            if new_k is not None:
                v_new = qkv[:, self.q_size + self.kv_size :].view(-1, self.num_kv_heads, self.head_dim)
                new_kv = (new_k, v_new)
            out = batch.attend(fused_q, layer, new_kv)
        else:
            q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
            q = norm_rope(q.view(-1, self.num_q_heads, self.head_dim), positions, cos, sin, q_w, eps)
            k = norm_rope(k.view(-1, self.num_kv_heads, self.head_dim), positions, cos, sin, k_w, eps)
            out = batch.attention(q, k, v.view(-1, self.num_kv_heads, self.head_dim), layer)
        out = self.o_proj(out.reshape(-1, self.q_size))
        return all_reduce(out) if self.tp_size > 1 else out


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), act SiLU (SwiGLU) or tanh-GELU (GeGLU, Gemma).

    With cfg.tp_size > 1 it holds this rank's intermediate rows; down_proj is row-parallel,
    all-reduced."""

    def __init__(self, cfg: ModelConfig, intermediate_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.act = cfg.hidden_act
        self.tp_size = cfg.tp_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * intermediate_size, False, dtype=dtype)
        self.down_proj = nn.Linear(intermediate_size, cfg.hidden_size, False, dtype=dtype)

    def weight_pieces(self) -> dict[str, Piece]:
        size = self.intermediate_size
        return {
            "gate_proj.weight": Piece("gate_up_proj.weight", None, 0, size),
            "up_proj.weight": Piece("gate_up_proj.weight", None, size, size),
        }

    def forward(self, x: Any) -> torch.Tensor:
        """x: the normed hidden states, quantized (Fp8Rows) when gate_up_proj takes FP8."""
        hidden = act_and_mul(self.gate_up_proj(x), self.act, fp8=takes_fp8(self.down_proj))
        out = self.down_proj(hidden)
        return all_reduce(out) if self.tp_size > 1 else out
