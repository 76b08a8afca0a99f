"""The fast torch attention backend: ``scaled_dot_product_attention`` over whole KV pages.

The CPU default (``attention = "auto"`` off CUDA). It computes what TorchRefBackend (the
oracle) computes, with far fewer ops per layer:

    decode rows (extend_len == 1):  one SDPA call for all of them. Each row's pages are
        gathered whole into [B, kv_heads, P * page_size, D] (P: the most pages any row holds);
        a key mask hides each row's positions >= seq_len. The query heads of one KV head are
        that head's "queries" ([B, kv_heads, group, D]), so GQA needs no repeated K/V.
    prefill rows (extend_len > 1):  one SDPA call per request over its own pages; causal
        from position 0 when nothing is cached and the layer has no window, else an explicit
        mask (query j sits at position cached_len + j).

Each layer's LayerAttention (worker.models.config) picks its masks (one per distinct sliding
window, built in ``plan``; torch_ref.window_mask) and scale; a layer with a logit soft-cap
attends by explicit matmuls (SDPA has no soft-cap), the same float32 math as TorchRefBackend.

Pages, not locations, are gathered: a page_table row holds runs of page_size consecutive
locations starting at multiples of page_size (worker.attention.base), so page i of a
request is ``page_table[slot, i * page_size] // page_size``. Entries past a row's seq_len
may be stale, but they are valid locations, and the mask hides them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from worker.attention.torch_ref import PagedTorchBackend, softcapped, window_mask
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool


@dataclass(frozen=True)
class _DecodePlan:
    rows: torch.Tensor | None  # int64 query rows of the decode requests; None: every row, in order
    pages: torch.Tensor  # int64 [B, P] page ids, P the most pages any of them holds
    # sliding window (0: none) -> bool [B, 1, 1, P * page_size], True where the key is visible
    key_masks: dict[int, torch.Tensor]


@dataclass(frozen=True)
class _PrefillPlan:
    q_start: int  # first row of the request's queries in the flattened [T] tokens
    q_end: int
    pages: torch.Tensor  # int64 [P] the request's pages
    seq_len: int
    # sliding window -> bool [extend_len, seq_len]; a window missing: causal from position 0
    masks: dict[int, torch.Tensor]


@dataclass(frozen=True)
class SdpaPlan:
    decode: _DecodePlan | None
    prefills: list[_PrefillPlan]


class TorchSdpaBackend(PagedTorchBackend):
    """Paged attention through torch SDPA, float32 math (module docstring); any device."""

    def plan(self, layout: BatchLayout) -> SdpaPlan:
        device = self.page_table.device
        ps = self.page_size
        slots = layout.slots_cpu.tolist()
        cached = layout.cached_lens_cpu.tolist()
        extend = layout.extend_lens_cpu.tolist()
        decode_rows: list[int] = []
        decode_batch: list[int] = []
        prefills: list[_PrefillPlan] = []
        q_start = 0
        for i, (slot, cached_len, extend_len) in enumerate(zip(slots, cached, extend, strict=True)):
            seq_len = cached_len + extend_len
            if extend_len == 1:
                decode_rows.append(q_start)
                decode_batch.append(i)
            else:
                pages = self.page_table[slot, 0 : -(-seq_len // ps) * ps : ps].long() // ps
                q_pos = torch.arange(cached_len, seq_len, device=device).unsqueeze(1)
                k_pos = torch.arange(seq_len, device=device).unsqueeze(0)
                masks = {w: window_mask(q_pos, k_pos, w) for w in self.windows if w or cached_len}
                prefills.append(_PrefillPlan(q_start, q_start + extend_len, pages, seq_len, masks))
            q_start += extend_len
        decode = None
        if decode_rows:
            seq_lens = [cached[i] + 1 for i in decode_batch]
            num_pages = -(-max(seq_lens) // ps)
            rows_slots = layout.slots_cpu[decode_batch].to(device=device, dtype=torch.long)
            pages = self.page_table[rows_slots, 0 : num_pages * ps : ps].long() // ps
            q_pos = torch.tensor(seq_lens, device=device).unsqueeze(1) - 1  # the decoding token
            k_pos = torch.arange(num_pages * ps, device=device).unsqueeze(0)
            key_masks = {w: window_mask(q_pos, k_pos, w).view(len(seq_lens), 1, 1, -1) for w in self.windows}
            every_row = len(decode_rows) == q_start
            rows = None if every_row else torch.tensor(decode_rows, dtype=torch.long, device=device)
            decode = _DecodePlan(rows, pages, key_masks)
        return SdpaPlan(decode, prefills)

    def forward(
        self,
        q: torch.Tensor,
        layer_id: int,
        meta: SdpaPlan,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        num_kv_heads, head_dim = self.kv.num_kv_heads, self.head_dim
        group = self.num_q_heads // num_kv_heads
        options = self.attention_of(layer_id)
        window, scale, cap = options.sliding_window, options.scale_for(head_dim), options.logit_softcap
        d = meta.decode
        out = None if d is not None and d.rows is None else torch.empty_like(q)
        if d is not None:
            qd = q if d.rows is None else q[d.rows]
            batch = qd.shape[0]
            k, v = self._pages(layer_id, d.pages.view(-1))  # [B * P, kv_heads, page_size, D]
            k = k.view(batch, -1, num_kv_heads, self.page_size, head_dim).transpose(1, 2)
            v = v.view(batch, -1, num_kv_heads, self.page_size, head_dim).transpose(1, 2)
            k = k.reshape(batch, num_kv_heads, -1, head_dim)
            v = v.reshape(batch, num_kv_heads, -1, head_dim)
            qg = qd.float().view(batch, num_kv_heads, group, head_dim)
            o = _attend(qg, k, v, d.key_masks[window], scale, cap)
            o = o.view(batch, self.num_q_heads, head_dim).to(q.dtype)
            if out is None:  # every row decodes: nothing else to attend
                return o
            out[d.rows] = o
        assert out is not None
        for p in meta.prefills:
            k, v = self._pages(layer_id, p.pages)  # [P, kv_heads, page_size, D]
            k = k.transpose(0, 1).reshape(1, num_kv_heads, -1, head_dim)[:, :, : p.seq_len]
            v = v.transpose(0, 1).reshape(1, num_kv_heads, -1, head_dim)[:, :, : p.seq_len]
            qi = q[p.q_start : p.q_end].float().transpose(0, 1).unsqueeze(0)  # [1, Hq, E, D]
            o = _attend(qi, k, v, p.masks.get(window), scale, cap)
            out[p.q_start : p.q_end] = o[0].transpose(0, 1).to(q.dtype)
        return out

    def _pages(self, layer_id: int, pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V pages ``pages`` of the layer in float32, [len(pages), kv_heads, page_size, D]."""
        kv = self.kv
        k = kv.k_buffer(layer_id).index_select(0, pages)
        v = kv.v_buffer(layer_id).index_select(0, pages)
        if kv.quantized:  # pages hold k / k_scale (worker.kvcache.pool)
            return k.float() * kv.k_scale[layer_id], v.float() * kv.v_scale[layer_id]
        return k.float(), v.float()


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, cap: float
) -> torch.Tensor:
    """Attention of q [N, Hq, E, D] over k, v [N, Hkv, S, D] (Hkv divides Hq; float32); ``mask``
    bool broadcast to [N, Hq, E, S], None: causal with E == S. With a soft-cap ``cap`` > 0,
    explicit matmuls (torch_ref's math), else SDPA."""
    if not cap:
        causal = mask is None
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
        )
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = softcapped(torch.matmul(q, k.transpose(-1, -2)) * scale, cap)
    if mask is None:
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.matmul(probs, v)


def create(
    *, kv: KVPool, page_table: torch.Tensor, model_config, page_size: int, device, **_: object
) -> TorchSdpaBackend:
    """Registry factory (see worker.attention.registry)."""
    mc = model_config
    return TorchSdpaBackend(
        kv, page_table, mc.num_q_heads, mc.head_dim, page_size, getattr(mc, "layer_attention", ())
    )
