"""Per-layer attention options (worker.models.config.LayerAttention: sliding window, logit
soft-cap, scale) in both torch backends, against a float64 dense oracle that applies them
token by token: queries over a cached prefix longer than the window (a radix hit or an
earlier chunk), fresh prefills crossing the window, decodes, GQA, shuffled pages."""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.test_attention_torch_ref import HEAD_DIM, LAYER, paged_scenario
from worker.attention.torch_ref import TorchRefBackend
from worker.attention.torch_sdpa import TorchSdpaBackend
from worker.models.config import LayerAttention

BATCHES = {
    "decode": [(0, 7, 1), (2, 30, 1), (4, 0, 1), (6, 3, 1)],  # (slot, cached_len, extend_len)
    "prefill": [(1, 0, 19), (3, 12, 6), (5, 0, 2)],
    "mixed": [(0, 7, 1), (3, 12, 6), (2, 30, 1), (1, 0, 19)],
}
OPTIONS = {
    "window": LayerAttention(sliding_window=5),
    "window-1": LayerAttention(sliding_window=1),  # each query sees itself only
    "softcap": LayerAttention(logit_softcap=1.5),
    "scale": LayerAttention(scale=0.7),
    "all": LayerAttention(sliding_window=4, logit_softcap=2.0, scale=0.5),
}


def dense(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached_len: int, opt: LayerAttention
) -> torch.Tensor:
    """q [E, Hq, D] at positions cached_len.., k/v [S, Hkv, D]; float64, one query at a time."""
    group = q.shape[1] // k.shape[1]
    scale = opt.scale or 1 / math.sqrt(q.shape[2])
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(q.shape[0]):
        pos = cached_len + j
        first = max(0, pos - opt.sliding_window + 1) if opt.sliding_window else 0
        for h in range(q.shape[1]):
            scores = k[first : pos + 1, h // group].double() @ q[j, h].double() * scale
            if opt.logit_softcap:
                scores = opt.logit_softcap * torch.tanh(scores / opt.logit_softcap)
            out[j, h] = torch.softmax(scores, 0) @ v[first : pos + 1, h // group].double()
    return out


@pytest.mark.parametrize("backend_cls", [TorchRefBackend, TorchSdpaBackend])
@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("page_size", [1, 4])
def test_layer_options_match_dense(backend_cls, option, batch, page_size):
    requests = BATCHES[batch]
    kv, page_table, q, layout, _ = paged_scenario(requests, page_size, 6, 2, seed=page_size)
    q = q * 4  # scores of several units, so the soft-cap bites
    opt = OPTIONS[option]
    backend = backend_cls(kv, page_table, 6, HEAD_DIM, page_size, layers=(LayerAttention(), opt))
    out = backend.forward(q, LAYER, backend.plan(layout))
    expected, start = [], 0
    for slot, cached_len, extend_len in requests:
        k, v = kv.gather(LAYER, page_table[slot, : cached_len + extend_len].long())
        expected.append(dense(q[start : start + extend_len], k, v, cached_len, opt))
        start += extend_len
    torch.testing.assert_close(out.double(), torch.cat(expected), atol=1e-5, rtol=1e-5)
    # the option changes the result: the layer without it attends differently
    plain = backend.forward(q, 0, backend.plan(layout))
    assert (plain - out).abs().max() > 1e-3


def test_decode_inside_the_window_is_plain_attention():
    """A window longer than every sequence masks nothing: the same output as no window."""
    requests = BATCHES["mixed"]
    kv, page_table, q, layout, expected = paged_scenario(requests, 4, 6, 2, seed=9)
    for cls in (TorchRefBackend, TorchSdpaBackend):
        backend = cls(
            kv, page_table, 6, HEAD_DIM, 4, layers=(LayerAttention(), LayerAttention(sliding_window=64))
        )
        out = backend.forward(q, LAYER, backend.plan(layout))
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
