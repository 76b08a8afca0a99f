"""Cascade (shared-prefix) attention in plain torch: the reference for the FlashInfer version.

For a pass whose layout carries PrefixGroups (worker.attention.base), attention over a
request's keys splits at its group's prefix length P (whole pages, P <= cached_len, so every
query sees all of the prefix and the causal mask only bites in the suffix)::

    row of request i:  [ shared prefix: positions 0 .. P-1 | own suffix: P .. seq_len-1 ]
    prefix state:      once per group, all the group's queries against the prefix, no mask
    suffix state:      per request, its queries against its suffix, causal (query j at cached_len + j)
    output:            merge of the two by log-sum-exp

    merge((o_a, s_a), (o_b, s_b)):  s = logaddexp(s_a, s_b),
                                    o = o_a * exp(s_a - s) + o_b * exp(s_b - s)

where s is the natural log of the sum of exp(score) over that part's keys. Requests in no group
have P = 0: their suffix is the whole row and their output is the plain one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from worker.attention.torch_ref import TorchRefBackend, _RequestPlan
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool


def attend_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention with its log-sum-exp, float32.

    q [E, H, D], k and v [S, H, D] (KV heads already repeated for GQA), mask [E, S] bool or
    None (all visible). Returns out [E, H, D] and lse [E, H]; every row must see a key."""
    qh, kh, vh = q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1)
    scores = torch.matmul(qh, kh.transpose(1, 2)) * scale  # [H, E, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [H, E]
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vh)  # [H, E, D]
    return out.transpose(0, 1), lse.transpose(0, 1)


def merge_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A + B from attention over A and over B (module docstring)."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = o_a * torch.exp(lse_a - lse).unsqueeze(-1) + o_b * torch.exp(lse_b - lse).unsqueeze(-1)
    return out, lse


@dataclass(frozen=True)
class _GroupPlan:
    rows: torch.Tensor  # int64 query rows of the group's members, in batch order
    kv_locs: torch.Tensor  # int64 [P] locations of the shared prefix


@dataclass(frozen=True)
class CascadePlan:
    suffixes: list[_RequestPlan]  # per request: its keys past the group's prefix
    groups: list[_GroupPlan]


class TorchCascadeBackend(TorchRefBackend):
    """TorchRefBackend that attends to each group's shared prefix once (cascade attention);
    a layout without prefix groups runs the plain reference path."""

    supports_cascade = True

    def plan(self, layout: BatchLayout) -> list[_RequestPlan] | CascadePlan:  # type: ignore[override]
        pg = layout.prefix_groups
        if pg is None:
            return super().plan(layout)
        device = self.page_table.device
        cached = layout.cached_lens_cpu.tolist()
        extend = layout.extend_lens_cpu.tolist()
        prefix = pg.prefix_lens_cpu.tolist()
        slots = layout.slots_cpu.tolist()
        q_starts = [0]
        for e in extend:
            q_starts.append(q_starts[-1] + e)
        suffixes = []
        for i, (slot, cached_len, extend_len, p) in enumerate(
            zip(slots, cached, extend, prefix, strict=True)
        ):
            assert p <= cached_len, f"request {i}: shared prefix {p} past its cached {cached_len} tokens"
            seq_len = cached_len + extend_len
            kv_locs = self.page_table[slot, p:seq_len].long()
            q_pos = torch.arange(cached_len, seq_len, device=device).unsqueeze(1)
            k_pos = torch.arange(p, seq_len, device=device).unsqueeze(0)
            suffixes.append(_RequestPlan(q_starts[i], q_starts[i + 1], kv_locs, k_pos <= q_pos))
        groups = []
        for members in pg.members():
            p = prefix[members[0]]
            rows = torch.cat([torch.arange(q_starts[i], q_starts[i + 1]) for i in members]).to(device)
            groups.append(_GroupPlan(rows, self.page_table[slots[members[0]], :p].long()))
        return CascadePlan(suffixes, groups)

    def forward(  # type: ignore[override]
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: list[_RequestPlan] | CascadePlan,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if not isinstance(meta, CascadePlan):
            return super().forward(q, layer_id, meta)
        num_rows, num_heads, head_dim = q.shape
        out = torch.empty(num_rows, num_heads, head_dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_rows, num_heads, dtype=torch.float32, device=q.device)
        for plan in meta.suffixes:
            k, v = self._kv(layer_id, plan.kv_locs)
            rows = slice(plan.q_start, plan.q_end)
            out[rows], lse[rows] = attend_with_lse(q[rows], k, v, plan.mask, self.scale)
        for group in meta.groups:
            k, v = self._kv(layer_id, group.kv_locs)
            o_p, lse_p = attend_with_lse(q[group.rows], k, v, None, self.scale)
            out[group.rows], lse[group.rows] = merge_states(o_p, lse_p, out[group.rows], lse[group.rows])
        return out.to(q.dtype)

    def _kv(self, layer_id: int, locs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``locs`` with KV heads repeated to the query heads: [S, H, D] each."""
        repeat = self.num_q_heads // self.kv.num_kv_heads
        k, v = self.kv.gather(layer_id, locs)
        return k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)


def create(
    *, kv: KVPool, page_table: torch.Tensor, model_config: Any, page_size: int, device: Any, **_: object
) -> TorchCascadeBackend:
    """Registry factory (worker.attention.registry.CASCADE_BACKENDS)."""
    return TorchCascadeBackend(kv, page_table, model_config.num_q_heads, model_config.head_dim, page_size)
