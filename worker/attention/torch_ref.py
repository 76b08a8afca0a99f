"""The reference attention backend: plain torch, any device, float32 math. The oracle."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.attention.base import AttentionBackend
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool


@dataclass(frozen=True)
class _RequestPlan:
    q_start: int  # first row of this request's queries in the flattened [T] tokens
    q_end: int
    kv_locs: torch.Tensor  # int64 [seq_len] KV locations, token 0 .. seq_len-1
    mask: torch.Tensor  # bool [extend_len, seq_len], True where the query may attend


class PagedTorchBackend(AttentionBackend):
    """What the torch backends share: the pool, its page table and the head shape."""

    def __init__(
        self, kv: KVPool, page_table: torch.Tensor, num_q_heads: int, head_dim: int, page_size: int
    ) -> None:
        if num_q_heads % kv.num_kv_heads != 0:
            raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={kv.num_kv_heads}")
        self.kv = kv
        self.page_table = page_table
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.page_size = page_size
        self.scale = head_dim**-0.5


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
            plans.append(_RequestPlan(q_start, q_start + extend_len, kv_locs, k_pos <= q_pos))
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
        out = torch.empty_like(q)
        for plan in meta:
            qi = q[plan.q_start : plan.q_end].float().transpose(0, 1)  # [H, E, D]
            k, v = self.kv.gather(layer_id, plan.kv_locs)  # [S, kv_heads, D] each
            ki = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [H, S, D]
            vi = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
            scores = torch.matmul(qi, ki.transpose(1, 2)) * self.scale  # [H, E, S]
            scores = scores.masked_fill(~plan.mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[plan.q_start : plan.q_end] = torch.matmul(probs, vi).transpose(0, 1).to(q.dtype)
        return out


def create(
    *, kv: KVPool, page_table: torch.Tensor, model_config, page_size: int, device, **_: object
) -> TorchRefBackend:
    """Registry factory (see worker.attention.registry)."""
    return TorchRefBackend(kv, page_table, model_config.num_q_heads, model_config.head_dim, page_size)
