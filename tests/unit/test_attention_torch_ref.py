"""TorchRefBackend vs dense attention over contiguous K/V, on random data."""

from __future__ import annotations

import math

import pytest
import torch

from worker.attention.registry import create_backend, resolve_backend_name
from worker.attention.torch_ref import TorchRefBackend
from worker.forward import BatchLayout
from worker.kvcache.pool import KVPool
from worker.models.config import ModelConfig

HEAD_DIM, NUM_LAYERS, LAYER, MAX_LEN = 16, 2, 1, 48


def _dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached_len: int) -> torch.Tensor:
    """float64 oracle: q [E, Hq, D] at positions cached_len.., k/v [S, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for h in range(q.shape[1]):
        for j in range(q.shape[0]):
            visible = cached_len + j + 1
            scores = k[:visible, h // group].double() @ q[j, h].double() / math.sqrt(q.shape[2])
            out[j, h] = torch.softmax(scores, 0) @ v[:visible, h // group].double()
    return out


def paged_scenario(requests, page_size, num_q_heads, num_kv_heads, seed, cache_dtype=None):
    """Random K/V of each (slot, cached_len, extend_len) request at shuffled pages of a pool's
    layer LAYER: (pool, page table, queries [T, Hq, D], layout, float64 dense output)."""
    gen = torch.Generator().manual_seed(seed)
    num_pages = 8 * (MAX_LEN // page_size) + 1
    kv = KVPool(NUM_LAYERS, num_pages, page_size, num_kv_heads, HEAD_DIM, torch.float32, "cpu", cache_dtype)
    page_table = torch.zeros(8, MAX_LEN, dtype=torch.int32)
    free_pages = torch.randperm(num_pages, generator=gen).tolist()
    keys, values, queries = [], [], []
    for slot, cached_len, extend_len in requests:
        seq_len = cached_len + extend_len
        pages = [free_pages.pop() for _ in range(-(-seq_len // page_size))]
        locs = torch.tensor([pages[i // page_size] * page_size + i % page_size for i in range(seq_len)])
        page_table[slot, :seq_len] = locs.int()
        # stale locations past the row's end, as a reused slot holds: the mask must hide them
        page_table[slot, seq_len:] = torch.randint(0, num_pages * page_size, (1,), generator=gen).int()
        k = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=gen)
        v = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=gen)
        kv.store(LAYER, locs, k, v)
        k, v = kv.gather(LAYER, locs)  # what the pages hold (FP8: the rounded values)
        keys.append(k), values.append(v)
        queries.append(torch.randn(extend_len, num_q_heads, HEAD_DIM, generator=gen))
    layout = BatchLayout(
        slots_cpu=torch.tensor([r[0] for r in requests], dtype=torch.int32),
        cached_lens_cpu=torch.tensor([r[1] for r in requests], dtype=torch.int32),
        extend_lens_cpu=torch.tensor([r[2] for r in requests], dtype=torch.int32),
    )
    expected = torch.cat(
        [_dense_attention(q, k, v, r[1]) for q, k, v, r in zip(queries, keys, values, requests, strict=True)]
    )
    return kv, page_table, torch.cat(queries), layout, expected


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (8, 2), (6, 1)])
def test_mixed_batch_matches_dense(page_size, num_q_heads, num_kv_heads):
    """Fresh prefill, prefill over a cached prefix and decodes in one batch, on shuffled pages."""
    requests = [(3, 0, 9), (0, 7, 5), (5, 20, 1), (1, 1, 1), (2, 0, 1)]  # (slot, cached_len, extend_len)
    kv, page_table, q, layout, expected = paged_scenario(
        requests, page_size, num_q_heads, num_kv_heads, seed=page_size * 100 + num_q_heads
    )
    backend = TorchRefBackend(kv, page_table, num_q_heads, HEAD_DIM, page_size)
    out = backend.forward(q, LAYER, backend.plan(layout))
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_pool_and_queries_keep_dtype():
    kv = KVPool(1, 4, 4, 2, 8, torch.bfloat16, "cpu")
    page_table = torch.arange(16, dtype=torch.int32).view(1, 16)
    kv.store(0, torch.arange(5), torch.randn(5, 2, 8), torch.randn(5, 2, 8))
    backend = TorchRefBackend(kv, page_table, 4, 8, 4)
    layout = BatchLayout(
        torch.tensor([0], dtype=torch.int32),
        torch.tensor([2], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32),
    )
    q = torch.randn(3, 4, 8, dtype=torch.bfloat16)
    out = backend.forward(q, 0, backend.plan(layout))
    k, v = kv.gather(0, torch.arange(5))
    expected = _dense_attention(q.float(), k.float(), v.float(), 2)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)


def test_registry_resolves_names():
    """ "auto" is sdpa on CPU and flashinfer on CUDA; unknown names are refused."""
    assert resolve_backend_name("auto", "cpu") == "sdpa"
    assert resolve_backend_name("torch", "cpu") == "torch"
    assert resolve_backend_name("auto", "cuda") == "flashinfer"
    with pytest.raises(ValueError, match="unknown attention backend"):
        resolve_backend_name("xformers", "cpu")
    config = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=8,
        hidden_size=16,
        num_layers=1,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=4,
        intermediate_size=8,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        rope_scaling=None,
        max_position_embeddings=16,
        tie_word_embeddings=True,
        qk_norm=False,
        attention_bias=False,
        eos_token_ids=(0,),
    )
    kv = KVPool(1, 4, 2, 2, 4, torch.float32, "cpu")
    page_table = torch.zeros(2, 8, dtype=torch.int32)
    backend = create_backend(
        "torch", kv=kv, page_table=page_table, model_config=config, page_size=2, device="cpu"
    )
    assert isinstance(backend, TorchRefBackend) and backend.num_q_heads == 4


def test_missing_backend_package_is_named(monkeypatch):
    """Asking for FlashInfer where it is not installed says what to install or choose."""
    import sys

    from worker.attention.registry import create_backend

    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> ImportError
    monkeypatch.delitem(sys.modules, "worker.attention.flashinfer", raising=False)
    with pytest.raises(ImportError, match='radixq\\[gpu\\].*attention = "torch"'):
        create_backend("flashinfer", kv=None, page_table=None, model_config=None, page_size=1, device="cpu")


def test_pool_keeps_each_heads_page_contiguous():
    """HND pages: location loc, head h lives at [loc // page_size, h, loc % page_size]."""
    kv = KVPool(1, 3, 4, 2, 8, torch.float32, "cpu")
    locs = torch.tensor([9, 0, 6])
    k = torch.randn(3, 2, 8)
    kv.store(0, locs, k, -k)
    buffer = kv.k_buffer(0)
    assert buffer.shape == (3, 2, 4, 8) and buffer.is_contiguous()
    for i, loc in enumerate(locs.tolist()):
        for head in range(2):
            torch.testing.assert_close(buffer[loc // 4, head, loc % 4], k[i, head])
            torch.testing.assert_close(kv.v_buffer(0)[loc // 4, head, loc % 4], -k[i, head])
    got_k, got_v = kv.gather(0, locs)
    torch.testing.assert_close(got_k, k)
    torch.testing.assert_close(got_v, -k)
