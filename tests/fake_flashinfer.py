"""A stand-in for the ``flashinfer`` package, for CPU tests of FlashInferBackend's plumbing.

NOT FlashInfer's kernels (tests/gpu runs those): small wrappers that attend densely by the
documented meaning of their plan arguments (pages from indptr/indices/last_page_len; queries
placed at the end of the KV they are given, so causal keeps key k for row i when
``k <= kv_len - qo_len + i`` and ``window_left`` keeps it when ``k >= kv_len - qo_len + i -
window_left``, causal or not; ``logits_soft_cap * tanh(s / logits_soft_cap)``; ``sm_scale``
defaulting to head_dim ** -0.5, k_scale folded into it, v_scale on the output), the ragged
wrapper over [T, heads, dim] keys, and ``merge_state_in_place`` by log-sum-exp. The fake's
log-sum-exp is natural (FlashInfer's is base 2); only its own merge reads it.

    module = install(monkeypatch)   # worker.attention.flashinfer, imported over the fake

Also ``Scenario``: a pool with random pages per request and the masked-attention oracle.
"""

from __future__ import annotations

import importlib
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool
from worker.models.config import LayerAttention

PAGE_SIZE, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 4, 2, 8
MAX_LEN = 64
# the modules that import flashinfer: imported afresh over each test's fake
_MODULES = ("worker.attention.flashinfer_fp8_prefill", "worker.attention.flashinfer")


def attend(q, k, v, plan: dict, causal: bool, k_scale=None, v_scale=None):
    """q [Q, Hq, D] at the end of k/v [K, Hkv, D]: (out [Q, Hq, D] float32, lse [Q, Hq])."""
    qo_len, kv_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    sm_scale = (plan["sm_scale"] or q.shape[-1] ** -0.5) * (k_scale or 1.0)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    cap, window_left = plan["logits_soft_cap"], plan["window_left"]
    if cap > 0:
        scores = cap * torch.tanh(scores / cap)
    kv_idx, qo_idx = torch.arange(kv_len)[None, :], torch.arange(qo_len)[:, None]
    keep = kv_idx <= kv_len - qo_len + qo_idx if causal else torch.ones_like(kv_idx, dtype=torch.bool)
    if window_left >= 0:
        keep = keep & (kv_idx + qo_len + window_left >= kv_len + qo_idx)
    scores = scores.masked_fill(~keep, float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v) * (v_scale or 1.0)
    return out, torch.logsumexp(scores, -1).transpose(0, 1)


def _finish(q, outs, lses, out, return_lse):
    result = torch.cat(outs).to(q.dtype)
    result = out.copy_(result) if out is not None else result
    return (result, torch.cat(lses)) if return_lse else result


class _FakeWrapper:
    """plan() records the pages and options; run() attends from them."""

    def __init__(
        self, float_workspace, kv_layout, *, use_tensor_cores=False, use_cuda_graph=False, backend="auto", **_
    ):
        assert kv_layout == "HND"
        self.backend = backend  # the kernel family asked for (fa2, fa3, auto)
        self._float_workspace_buffer = float_workspace
        self.use_tensor_cores = use_tensor_cores
        self.is_cuda_graph_enabled = use_cuda_graph
        self.plans: list[dict] = []

    def _record(self, qo_lens, kv_indptr, indices, last_page_len, page_size, **kw) -> None:
        pages = [
            indices[a:b].long() for a, b in zip(kv_indptr[:-1].tolist(), kv_indptr[1:].tolist(), strict=True)
        ]
        self.plans.append(
            dict(
                kw,
                qo_lens=qo_lens,
                pages=pages,
                kv_lens=[
                    (len(p) - 1) * page_size + int(last) for p, last in zip(pages, last_page_len, strict=True)
                ],
                int_workspace=self._int_workspace_buffer,
                staging=self._pin_memory_int_workspace_buffer,
            )
        )

    def run(self, q, paged_kv, out=None, k_scale=None, v_scale=None, return_lse=False):
        plan = self.plans[-1]
        k_pages, v_pages = paged_kv
        outs, lses, row = [], [], 0
        for qo_len, pages, kv_len in zip(plan["qo_lens"], plan["pages"], plan["kv_lens"], strict=True):
            k, v = (x[pages].transpose(1, 2).flatten(0, 1)[:kv_len] for x in (k_pages, v_pages))
            o, lse = attend(q[row : row + qo_len], k, v, plan, bool(plan.get("causal")), k_scale, v_scale)
            outs.append(o)
            lses.append(lse)
            row += qo_len
        return _finish(q, outs, lses, out, return_lse)


class _FakeDecode(_FakeWrapper):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        if self.is_cuda_graph_enabled:  # the fixed buffers the backend hands over
            self._paged_kv_indptr_buf = kw["paged_kv_indptr_buffer"]
            self._paged_kv_indices_buf = kw["paged_kv_indices_buffer"]
            self._paged_kv_last_page_len_buf = kw["paged_kv_last_page_len_buffer"]
            self._fixed_batch_size = len(self._paged_kv_indptr_buf) - 1

    def plan(self, kv_indptr, indices, last_page_len, qo_heads, kv_heads, head_dim, page_size, **kw):
        self._record([1] * (len(kv_indptr) - 1), kv_indptr, indices, last_page_len, page_size, **kw)
        if not self.use_tensor_cores:
            return
        # FlashInfer keeps the module and buffers plan() set up; the backend re-plans through them
        self._cached_module = _FakeTensorCoreModule(self)
        if self.is_cuda_graph_enabled:
            self._paged_kv_indices_buf[: len(indices)].copy_(indices)
            self._paged_kv_last_page_len_buf.copy_(last_page_len)
        else:
            self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = indices, last_page_len


class _FakeTensorCoreModule:
    """The prefill module's plan() of tensor-core decode: its positional arguments as FlashInfer
    0.6 passes them; window_left is the 16th. The other options stay those of the first plan."""

    def __init__(self, wrapper: _FakeDecode) -> None:
        self.wrapper = wrapper

    def plan(self, *args):
        w = self.wrapper
        kv_indptr, page_size, causal, window_left = args[4], args[10], args[14], args[15]
        first = w.plans[0]
        w._record(
            [1] * (len(kv_indptr) - 1), kv_indptr, w._paged_kv_indices_buf, w._paged_kv_last_page_len_buf,
            page_size, causal=causal, window_left=window_left, logits_soft_cap=first["logits_soft_cap"],
            sm_scale=first["sm_scale"],
        )  # fmt: skip


class _FakePrefill(_FakeWrapper):
    def plan(
        self, qo_indptr, kv_indptr, indices, last_page_len, qo_heads, kv_heads, head_dim, page_size, **kw
    ):
        qo_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
        self._record(qo_lens, kv_indptr, indices, last_page_len, page_size, **kw)


class _FakeRagged:
    """BatchPrefillWithRaggedKVCacheWrapper: keys and values as [T, kv heads, dim] rows."""

    def __init__(self, float_workspace, kv_layout, *, backend="auto", **_):
        assert kv_layout == "NHD"
        self.backend = backend
        self.plans: list[dict] = []

    def plan(self, qo_indptr, kv_indptr, qo_heads, kv_heads, head_dim, **kw):
        self.plans.append(
            dict(
                kw,
                qo_indptr=qo_indptr.tolist(),
                kv_indptr=kv_indptr.tolist(),
                int_workspace=self._int_workspace_buffer,
                staging=self._pin_memory_int_workspace_buffer,
            )
        )

    def run(self, q, k, v, out=None, return_lse=False):
        plan = self.plans[-1]
        qo, kv = plan["qo_indptr"], plan["kv_indptr"]
        outs, lses = [], []
        for r in range(len(qo) - 1):
            o, lse = attend(
                q[qo[r] : qo[r + 1]], k[kv[r] : kv[r + 1]], v[kv[r] : kv[r + 1]], plan, plan["causal"]
            )
            outs.append(o)
            lses.append(lse)
        return _finish(q, outs, lses, out, return_lse)


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """(v, s) becomes the merge of itself and (v_other, s_other): attention over both key sets."""
    assert mask is None
    merged = torch.logaddexp(s, s_other)
    w, w_other = torch.exp(s - merged)[..., None], torch.exp(s_other - merged)[..., None]
    v.copy_((v.float() * w + v_other.float() * w_other).to(v.dtype))
    s.copy_(merged)


def install(monkeypatch: pytest.MonkeyPatch):
    """Put the fake in sys.modules and import worker.attention.flashinfer over it."""
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _FakeDecode
    fake.BatchPrefillWithPagedKVCacheWrapper = _FakePrefill
    fake.BatchPrefillWithRaggedKVCacheWrapper = _FakeRagged
    fake.merge_state_in_place = merge_state_in_place
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    for name in _MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module("worker.attention.flashinfer")


def uninstall() -> None:
    for name in _MODULES:
        sys.modules.pop(name, None)


class Scenario:
    """A float32 KV pool (FP8 pages with ``cache_dtype``) with random pages per request, one
    slot a request."""

    def __init__(
        self,
        specs: list[tuple[int, int]],
        attentions: tuple[LayerAttention, ...],
        seed: int = 0,
        cache_dtype: torch.dtype | None = None,
    ):
        gen = torch.Generator().manual_seed(seed)
        self.specs, self.attentions = specs, attentions
        num_pages = sum(-(-(c + e) // PAGE_SIZE) for c, e in specs) + 1
        self.kv = KVPool(
            len(attentions), num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM, torch.float32, "cpu", cache_dtype
        )
        if self.kv.quantized:  # scales other than 1 must reach the kernels
            self.kv.set_scales([0.5 + 0.25 * i for i in range(len(attentions))], [2.0] * len(attentions))
        for layer in range(len(attentions)):
            for pages in (self.kv.k_buffer(layer), self.kv.v_buffer(layer)):
                pages.copy_(torch.randn(pages.shape, generator=gen).to(pages.dtype))
        self.page_table = torch.zeros(len(specs), MAX_LEN, dtype=torch.int32)
        free = torch.randperm(num_pages, generator=gen).tolist()
        for slot, (c, e) in enumerate(specs):
            pages = torch.tensor([free.pop() for _ in range(-(-(c + e) // PAGE_SIZE))])
            locs = (pages[:, None] * PAGE_SIZE + torch.arange(PAGE_SIZE)).flatten()[: c + e]
            self.page_table[slot, : c + e] = locs.to(torch.int32)
        self.config = SimpleNamespace(num_q_heads=Q_HEADS, layer_attention=attentions)
        self.layout = BatchLayout(
            slots_cpu=torch.arange(len(specs), dtype=torch.int32),
            cached_lens_cpu=torch.tensor([c for c, _ in specs], dtype=torch.int32),
            extend_lens_cpu=torch.tensor([e for _, e in specs], dtype=torch.int32),
        )
        self.q = torch.randn(sum(e for _, e in specs), Q_HEADS, HEAD_DIM, generator=gen)

    def backend(self, module, **kw):
        return module.FlashInferBackend(
            self.kv, self.page_table, self.config, PAGE_SIZE, "cpu", workspace_mib=1, **kw
        )

    def new_locs(self) -> torch.Tensor:
        """The pass's own KV locations, request by request (its rows' order)."""
        return torch.cat([self.page_table[slot, c : c + e].long() for slot, (c, e) in enumerate(self.specs)])

    def expected(self, layer: int, new_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Masked softmax attention of each new token at its absolute position (LayerAttention's
        meaning: keys p - sliding_window + 1 .. p; scale, then soft-cap) over the pool's values;
        with ``new_kv`` ([T, kv heads, dim] each, the pass's rows), the pass's own keys and values
        come from there instead, except in a windowed layer for a request with a cached prefix
        (worker.attention.flashinfer_fp8_prefill attends those rows whole from the pool)."""
        attention = self.attentions[layer]
        outs, row = [], 0
        for slot, (cached, extend) in enumerate(self.specs):
            k, v = self.kv.gather(layer, self.page_table[slot, : cached + extend].long())
            if new_kv is not None and not (attention.sliding_window and cached > 0):
                k = torch.cat([k[:cached], new_kv[0][row : row + extend]])
                v = torch.cat([v[:cached], new_kv[1][row : row + extend]])
            k, v = (x.repeat_interleave(Q_HEADS // KV_HEADS, 1) for x in (k, v))
            scores = torch.einsum("qhd,khd->hqk", self.q[row : row + extend], k) * attention.scale_for(
                HEAD_DIM
            )
            if attention.logit_softcap:
                scores = attention.logit_softcap * torch.tanh(scores / attention.logit_softcap)
            pos, key = torch.arange(cached, cached + extend)[:, None], torch.arange(cached + extend)[None, :]
            keep = key <= pos
            if attention.sliding_window:
                keep &= key > pos - attention.sliding_window
            outs.append(torch.einsum("hqk,khd->qhd", scores.masked_fill(~keep, float("-inf")).softmax(-1), v))
            row += extend
        return torch.cat(outs)
