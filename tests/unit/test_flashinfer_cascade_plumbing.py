"""FlashInferCascadeBackend's host plumbing on CPU, through a stand-in for flashinfer.

NOT a test of FlashInfer's kernels (tests/gpu/test_flashinfer_cascade.py does that on a GPU):
a small fake ``flashinfer`` module implements the documented meaning of the wrappers' plan
arguments (qo_indptr, paged_kv_indptr, page indices, last_page_len, causal aligned to the end
of the KV) with dense torch math, and merge_state by log-sum-exp. Through it, the backend's
page spans, query-row gathers and merges are checked against the torch reference. The fake's
plain path is checked against the reference first, so a wrong fake cannot pass unnoticed.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from tests.cascade_scenario import DECODE, PREFILL, PREFIX_PAGES, A, B, scenario
from worker.attention.torch_cascade import attend_with_lse, merge_states
from worker.attention.torch_ref import TorchRefBackend


class _FakeWrapper:
    """plan() records FlashInfer's paged-KV description; run() attends densely from it."""

    def __init__(self, float_workspace, kv_layout, *, use_tensor_cores=False, use_cuda_graph=False, **_):
        assert kv_layout == "HND"
        self.use_tensor_cores = use_tensor_cores
        self.is_cuda_graph_enabled = use_cuda_graph
        self.causal = False

    def _plan(
        self, qo_indptr, kv_indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, ps, **kw
    ):
        self.qo_indptr = [int(x) for x in qo_indptr]
        self.kv_indptr = [int(x) for x in kv_indptr]
        self.indices = indices.clone()
        self.last_page_len = [int(x) for x in last_page_len]
        self.causal = kw.get("causal", False)
        assert kw["seq_lens"].tolist() == [
            (b - a - 1) * ps + last
            for a, b, last in zip(self.kv_indptr[:-1], self.kv_indptr[1:], self.last_page_len, strict=True)
        ]

    def run(self, q, paged_kv, out=None, return_lse=False):
        k_pages, v_pages = paged_kv  # [pages, kv_heads, page_size, head_dim]
        repeat = q.shape[1] // k_pages.shape[1]
        o = torch.empty(q.shape, dtype=torch.float32)
        lse = torch.empty(q.shape[:2], dtype=torch.float32)
        for r in range(len(self.kv_indptr) - 1):
            pages = self.indices[self.kv_indptr[r] : self.kv_indptr[r + 1]].long()
            kv_len = (len(pages) - 1) * k_pages.shape[2] + self.last_page_len[r]
            k = k_pages[pages].transpose(1, 2).flatten(0, 1)[:kv_len].repeat_interleave(repeat, 1)
            v = v_pages[pages].transpose(1, 2).flatten(0, 1)[:kv_len].repeat_interleave(repeat, 1)
            rows = slice(self.qo_indptr[r], self.qo_indptr[r + 1])
            num_q = self.qo_indptr[r + 1] - self.qo_indptr[r]
            mask = None
            if self.causal:  # query j sits at KV position kv_len - num_q + j
                mask = torch.arange(kv_len).unsqueeze(0) <= (kv_len - num_q + torch.arange(num_q)).unsqueeze(
                    1
                )
            o[rows], lse[rows] = attend_with_lse(q[rows], k, v, mask, q.shape[-1] ** -0.5)
        o = o.to(q.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        return (o, lse) if return_lse else o


class _FakeDecode(_FakeWrapper):
    def plan(self, kv_indptr, indices, last_page_len, *args, **kw):
        self._plan(list(range(len(kv_indptr))), kv_indptr, indices, last_page_len, *args, **kw)


class _FakePrefill(_FakeWrapper):
    def plan(self, *args, **kw):
        self._plan(*args, **kw)


@pytest.fixture
def cascade_module(monkeypatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _FakeDecode
    fake.BatchPrefillWithPagedKVCacheWrapper = _FakePrefill
    fake.merge_state = merge_states
    # named by worker.attention.flashinfer_fp8_prefill, which runs only over FP8 pages (not here)
    fake.BatchPrefillWithRaggedKVCacheWrapper = fake.merge_state_in_place = None
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    for name in _MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("worker.attention.flashinfer_cascade")
    yield module
    for name in _MODULES:
        sys.modules.pop(name, None)


# the modules that import flashinfer: each test imports them afresh over its fake
_MODULES = (
    "worker.attention.flashinfer_fp8_prefill",
    "worker.attention.flashinfer",
    "worker.attention.flashinfer_cascade",
)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "requests", [DECODE, PREFILL, DECODE[:3] + PREFILL[:4]], ids=["decode", "prefill", "mixed"]
)
def test_cascade_plumbing_equals_reference(cascade_module, page_size, requests):
    num_q_heads, num_kv_heads = 8, 2
    kv, page_table, plain, grouped, q, layer = scenario(requests, page_size, num_q_heads, num_kv_heads, 11)
    reference = TorchRefBackend(kv, page_table, num_q_heads, 16, page_size)
    expected = reference.forward(q, layer, reference.plan(plain))
    config = types.SimpleNamespace(num_q_heads=num_q_heads)
    from worker.attention.registry import create_backend  # through the registry's cascade table

    backend = create_backend(
        "flashinfer", cascade=True, kv=kv, page_table=page_table, model_config=config,
        page_size=page_size, device="cpu", workspace_mib=1,
    )  # fmt: skip
    assert isinstance(backend, cascade_module.FlashInferCascadeBackend)
    # the fake is faithful on the plain path...
    torch.testing.assert_close(backend.forward(q, layer, backend.plan(plain)), expected, rtol=0, atol=1e-5)
    # ...and the cascade plan splits each row at its group's prefix and merges back exactly
    meta = backend.plan(grouped)
    assert isinstance(meta, cascade_module.CascadeMeta)
    indptr = meta.prefix_wrapper.kv_indptr  # each group's prefix is read once, whole pages
    assert [b - a for a, b in zip(indptr, indptr[1:], strict=False)] == [PREFIX_PAGES[A], PREFIX_PAGES[B]]
    grouped_rows = sum(e for (g, _, e) in requests if g is not None)
    assert meta.prefix_wrapper.qo_indptr[-1] == grouped_rows == int(meta.rows_gpu.numel())
    torch.testing.assert_close(backend.forward(q, layer, meta), expected, rtol=0, atol=1e-5)
