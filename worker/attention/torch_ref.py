"""The reference attention backend: plain torch, any device, float32 math. The oracle.

Both torch backends honour each layer's ``LayerAttention`` (worker.models.config): the
sliding window as a mask on absolute positions (query at position p sees keys p - window + 1
.. p), the logit soft-cap before the mask, the scale. Positions are a request's own token
indices, so the mask is the same whether the earlier tokens were computed in this pass, an
earlier chunk, or came from the prefix cache; keys outside the window stay in their pages
(nothing is freed early) and are only masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from worker.attention.base import AttentionBackend
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool
from worker.models.config import LayerAttention


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """bool, True where a query at ``q_pos`` may attend a key at ``k_pos`` (broadcast):
    causal, and within ``window`` tokens when window > 0."""
    mask = k_pos <= q_pos
    return mask & (k_pos > q_pos - window) if window else mask


def softcapped(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(scores / cap) (Gemma 2's attention-logit soft-capping); scores when cap is 0."""
    return scores if not cap else torch.tanh(scores / cap) * cap


@dataclass(frozen=True)
class _RequestPlan:
    q_start: int  # first row of this request's queries in the flattened [T] tokens
    q_end: int
    kv_locs: torch.Tensor  # int64 [seq_len] KV locations, token 0 .. seq_len-1
    mask: torch.Tensor  # bool [extend_len, seq_len], True where the query may attend (no window)
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # sliding window -> its mask

    def mask_for(self, window: int) -> torch.Tensor:
        return self.windowed[window] if window else self.mask


class PagedTorchBackend(AttentionBackend):
    """What the torch backends share: the pool, its page table, the head shape and each
    layer's attention options (``layers``: one LayerAttention per layer, () for defaults)."""

    def __init__(
        self,
        kv: KVPool,
        page_table: torch.Tensor,
        num_q_heads: int,
        head_dim: int,
        page_size: int,
        layers: Sequence[LayerAttention] = (),
    ) -> None:
        if num_q_heads % kv.num_kv_heads != 0:
            raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={kv.num_kv_heads}")
        self.kv = kv
        self.page_table = page_table
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.scale = head_dim**-0.5  # the default; a layer's own: attention_of(layer).scale_for
        self.layers = tuple(layers)
        self.windows = sorted({a.sliding_window for a in self.layers} | {0})  # the masks a plan builds

    def attention_of(self, layer_id: int) -> LayerAttention:
        return self.layers[layer_id] if self.layers else LayerAttention()


class TorchRefBackend(PagedTorchBackend):
    """Per request: gather K/V at page_table[slot, :seq_len], causal attention with offset
    cached_len (query j sits at position cached_len + j), GQA by repeating KV heads.

    Simple and exact rather than fast: plan and forward loop over requests in Python.
    """

    def plan(self, layout: BatchLayout) -> list[_RequestPlan]:
        device = self.page_table.device
        plans: list[_RequestPlan] = []
        q_start = 0
        slots = layout.slots_cpu.tolist()
        cached = layout.cached_lens_cpu.tolist()
        extend = layout.extend_lens_cpu.tolist()
        for slot, cached_len, extend_len in zip(slots, cached, extend, strict=True):
            seq_len = cached_len + extend_len
            kv_locs = self.page_table[slot, :seq_len].long()
            q_pos = torch.arange(cached_len, seq_len, device=device).unsqueeze(1)
            k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
            windowed = {w: window_mask(q_pos, k_pos, w) for w in self.windows if w}
            plans.append(_RequestPlan(q_start, q_start + extend_len, kv_locs, k_pos <= q_pos, windowed))
            q_start += extend_len
        return plans

    def forward(
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: list[_RequestPlan],
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        group = self.num_q_heads // self.kv.num_kv_heads
        options = self.attention_of(layer_id)
        scale = options.scale_for(self.head_dim)
        out = torch.empty_like(q)
        for plan in meta:
            qi = q[plan.q_start : plan.q_end].float().transpose(0, 1)  # [H, E, D]
            k, v = self.kv.gather(layer_id, plan.kv_locs)  # [S, kv_heads, D] each
            ki = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, S, D]
            vi = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
            scores = softcapped(torch.matmul(qi, ki.transpose(1, 2)) * scale, options.logit_softcap)
            scores = scores.masked_fill(~plan.mask_for(options.sliding_window), float("-inf"))  # [H, E, S]
            probs = torch.softmax(scores, dim=-1)
            out[plan.q_start : plan.q_end] = torch.matmul(probs, vi).transpose(0, 1).to(q.dtype)
        return out


def create(
    *, kv: KVPool, page_table: torch.Tensor, model_config, page_size: int, device, **_: object
) -> TorchRefBackend:
    """Registry factory (see worker.attention.registry)."""
    mc = model_config
    return TorchRefBackend(
        kv, page_table, mc.num_q_heads, mc.head_dim, page_size, getattr(mc, "layer_attention", ())
    )
