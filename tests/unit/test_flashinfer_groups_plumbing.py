"""FlashInferBackend's per-layer-group plans on CPU, through a stand-in for flashinfer.

NOT a test of FlashInfer's kernels (tests/gpu/test_flashinfer_backend.py runs those): a small
fake ``flashinfer`` module attends densely by the documented meaning of its plan arguments
(pages from indptr/indices/last_page_len, the causal diagonal aligned to the end of the KV,
``window_left`` keys before each query, ``logits_soft_cap * tanh(s / logits_soft_cap)``,
``sm_scale`` defaulting to head_dim ** -0.5, k_scale folded into it, v_scale on the output).
The backend's outputs for a model whose layers attend differently are checked against masked
attention written here from each layer's LayerAttention, and its bookkeeping (one plan a group,
separate int workspaces and staging buffers) is read from what the fake recorded.
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


class _FakeWrapper:
    """plan() records the pages and options; run() attends from them."""

    def __init__(self, float_workspace, kv_layout, *, use_tensor_cores=False, use_cuda_graph=False, **_):
        assert kv_layout == "HND"
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

    def run(self, q, paged_kv, out=None, k_scale=None, v_scale=None):
        plan = self.plans[-1]
        k_pages, v_pages = paged_kv
        sm_scale = (plan["sm_scale"] or q.shape[-1] ** -0.5) * (k_scale or 1.0)
        cap, window_left = plan["logits_soft_cap"], plan["window_left"]
        outs, row = [], 0
        for qo_len, pages, kv_len in zip(plan["qo_lens"], plan["pages"], plan["kv_lens"], strict=True):
            k, v = (x[pages].transpose(1, 2).flatten(0, 1)[:kv_len].float() for x in (k_pages, v_pages))
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", q[row : row + qo_len].float(), k) * sm_scale
            if cap > 0:
                scores = cap * torch.tanh(scores / cap)
            kv_idx, qo_idx = torch.arange(kv_len)[None, :], torch.arange(qo_len)[:, None]
            keep = (
                kv_idx <= kv_len - qo_len + qo_idx
                if plan.get("causal")
                else torch.ones_like(kv_idx, dtype=bool)
            )
            if window_left >= 0:
                keep = keep & (kv_idx + qo_len + window_left >= kv_len + qo_idx)
            scores = scores.masked_fill(~keep, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v) * (v_scale or 1.0))
            row += qo_len
        result = torch.cat(outs).to(q.dtype)
        return out.copy_(result) if out is not None else result


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


@pytest.fixture
def flashinfer_module(monkeypatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _FakeDecode
    fake.BatchPrefillWithPagedKVCacheWrapper = _FakePrefill
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.delitem(sys.modules, "worker.attention.flashinfer", raising=False)
    yield importlib.import_module("worker.attention.flashinfer")
    sys.modules.pop("worker.attention.flashinfer", None)


# layers 0 and 2 plan alike: three groups, layer 0's first
MIXED = (
    LayerAttention(sliding_window=5, logit_softcap=2.0),
    LayerAttention(scale=0.3),
    LayerAttention(sliding_window=5, logit_softcap=2.0),
    LayerAttention(),
)
PREFILL = [(13, 7), (0, 9), (6, 1), (22, 3)]  # (cached_len, extend_len): windows reach into prefixes
DECODE = [(20, 1), (3, 1), (9, 1)]


class Scenario:
    """A float32 KV pool with random pages per request, one slot a request."""

    def __init__(self, specs: list[tuple[int, int]], attentions: tuple[LayerAttention, ...], seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.specs, self.attentions = specs, attentions
        num_pages = sum(-(-(c + e) // PAGE_SIZE) for c, e in specs) + 1
        self.kv = KVPool(len(attentions), num_pages, PAGE_SIZE, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
        for layer in range(len(attentions)):
            for pages in (self.kv.k_buffer(layer), self.kv.v_buffer(layer)):
                pages.copy_(torch.randn(pages.shape, generator=gen))
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

    def expected(self, layer: int) -> torch.Tensor:
        """Masked softmax attention of each new token at its absolute position (LayerAttention's
        meaning: keys p - sliding_window + 1 .. p; scale, then soft-cap)."""
        attention = self.attentions[layer]
        outs, row = [], 0
        for slot, (cached, extend) in enumerate(self.specs):
            locs = self.page_table[slot, : cached + extend].long()
            k, v = (x.repeat_interleave(Q_HEADS // KV_HEADS, 1) for x in self.kv.gather(layer, locs))
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


def check_layers(backend, scenario: Scenario, meta) -> None:
    for layer in range(len(scenario.attentions)):
        got = backend.forward(scenario.q, layer, meta)
        torch.testing.assert_close(got, scenario.expected(layer), rtol=1e-5, atol=1e-5, msg=f"layer {layer}")


@pytest.mark.parametrize("specs", [PREFILL, DECODE], ids=["prefill", "decode"])
def test_each_layer_runs_its_groups_plan(flashinfer_module, specs) -> None:
    scenario = Scenario(specs, MIXED)
    backend = scenario.backend(flashinfer_module)
    assert backend.groups.group_of_layer == (0, 1, 0, 2)
    # the fake is faithful on a model that attends by default...
    plain = Scenario(specs, (LayerAttention(),) * 4)
    plain_backend = plain.backend(flashinfer_module)
    check_layers(plain_backend, plain, plain_backend.plan(plain.layout))
    # ...and each layer of the mixed model attends with its own window, cap and scale
    check_layers(backend, scenario, backend.plan(scenario.layout))
    if scenario.layout.is_decode:  # tensor-core decode: the second plan is the backend's fast re-plan
        backend = scenario.backend(flashinfer_module, use_tensor_cores=True)
        for _ in range(2):
            check_layers(backend, scenario, backend.plan(scenario.layout))
        assert all(len(decode[True].plans) == 2 for decode in backend._decodes)


@pytest.mark.parametrize(
    ("attentions", "expected_options"),
    [
        (MIXED, [(4, 2.0, None), (-1, 0.0, 0.3), (-1, 0.0, None)]),
        (MIXED[1:3] * 2, [(-1, 0.0, 0.3), (4, 2.0, None)]),
    ],
    ids=["three-groups", "two-groups"],
)
def test_groups_plan_into_their_own_workspaces(flashinfer_module, attentions, expected_options) -> None:
    """Each pass plans every group once, with its options, into distinct int workspaces and
    staging buffers; each group alternates its two staging buffers from pass to pass."""
    scenario = Scenario(PREFILL, attentions)
    backend = scenario.backend(flashinfer_module)
    for _ in range(3):
        backend.plan(scenario.layout)
    plans = [wrapper.plans for wrapper in backend._prefills]
    assert [len(p) for p in plans] == [3] * len(expected_options)
    for group_plans, (window_left, cap, scale) in zip(plans, expected_options, strict=True):
        assert all(
            (p["window_left"], p["logits_soft_cap"], p["sm_scale"]) == (window_left, cap, scale)
            for p in group_plans
        )
    for n in range(3):
        workspaces = {id(p[n]["int_workspace"]) for p in plans}
        staging = {id(p[n]["staging"]) for p in plans}
        assert len(workspaces) == len(staging) == len(expected_options)
    for group_plans in plans:
        assert group_plans[0]["staging"] is not group_plans[1]["staging"]
        assert group_plans[0]["staging"] is group_plans[2]["staging"]


def test_a_uniform_model_plans_once_with_default_options(flashinfer_module) -> None:
    scenario = Scenario(PREFILL, (LayerAttention(),) * 4)
    backend = scenario.backend(flashinfer_module)
    meta = backend.plan(scenario.layout)
    assert len(backend._prefills) == 1 and len(backend._int_workspaces) == 1 and meta.other_groups == ()
    (plan,) = backend._prefill.plans
    assert (plan["window_left"], plan["logits_soft_cap"], plan["sm_scale"]) == (-1, 0.0, None)


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_graph_decode_wrappers_one_a_group(flashinfer_module, use_tensor_cores) -> None:
    """Graph-mode wrappers exist per batch size and group; a re-plan for replay (here run
    eagerly: no graphs on CPU) attends each layer with its group's options, padding included."""
    scenario = Scenario(DECODE, MIXED, seed=3)
    backend = scenario.backend(flashinfer_module, use_tensor_cores=use_tensor_cores)
    backend.init_cuda_graphs([2, 4], max_seq_len=MAX_LEN)
    assert all(len(backend._graph_wrappers[bs]) == 3 for bs in (2, 4))
    backend.capture_meta(4)
    for _ in range(2):
        meta = backend.plan_for_replay(scenario.layout, 4)  # 3 requests padded to 4
        assert meta is backend._graph_metas[4]
        for layer in range(4):
            got = backend.forward(torch.cat([scenario.q, scenario.q[:1]]), layer, meta)[:3]
            torch.testing.assert_close(
                got, scenario.expected(layer), rtol=1e-5, atol=1e-5, msg=f"layer {layer}"
            )


def test_xqa_asked_for_a_soft_capped_model_is_refused(flashinfer_module) -> None:
    scenario = Scenario(DECODE, MIXED)
    with pytest.raises(ValueError, match="decode_kernel='xqa': XQA has no attention-logit soft-cap"):
        scenario.backend(flashinfer_module, decode_kernel="xqa")
