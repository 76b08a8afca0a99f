"""TorchSdpaBackend (the CPU default) vs a float64 dense oracle and vs TorchRefBackend, on
random K/V in shuffled pages: decode-only, prefill-only and mixed batches, GQA, FP8 pages."""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_attention_torch_ref import HEAD_DIM, LAYER, paged_scenario
from worker.attention.registry import create_backend
from worker.attention.torch_ref import TorchRefBackend
from worker.attention.torch_sdpa import TorchSdpaBackend
from worker.kvcache.pool import KVPool
from worker.models.config import ModelConfig

DECODES = [(0, 7, 1), (2, 30, 1), (4, 0, 1), (6, 15, 1)]  # (slot, cached_len, extend_len)
PREFILLS = [(1, 0, 9), (3, 12, 6), (5, 0, 33)]


BATCHES = {
    "decode": DECODES,
    "prefill": PREFILLS,
    "mixed": [DECODES[0], PREFILLS[1], DECODES[1], PREFILLS[0], DECODES[2]],
}


@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (9, 3), (6, 1)])
def test_matches_dense_and_reference(batch, page_size, num_q_heads, num_kv_heads):
    """Every row equals float64 dense attention, and the reference backend's output."""
    requests = BATCHES[batch]
    kv, page_table, q, layout, expected = paged_scenario(
        requests, page_size, num_q_heads, num_kv_heads, page_size
    )
    backend = TorchSdpaBackend(kv, page_table, num_q_heads, HEAD_DIM, page_size)
    out = backend.forward(q, LAYER, backend.plan(layout))
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    reference = TorchRefBackend(kv, page_table, num_q_heads, HEAD_DIM, page_size)
    torch.testing.assert_close(out, reference.forward(q, LAYER, reference.plan(layout)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", ["decode", "mixed"])
def test_fp8_pages_are_scaled_back(batch):
    """An FP8 pool with per-layer scales: the values the pages hold, times the scale."""
    kv, page_table, q, layout, _ = paged_scenario(BATCHES[batch], 4, 8, 2, 3, torch.float8_e4m3fn)
    kv.set_scales([1.0, 0.25], [1.0, 0.5])  # after store: the pages now read 4x / 2x smaller
    reference = TorchRefBackend(kv, page_table, 8, HEAD_DIM, 4)
    backend = TorchSdpaBackend(kv, page_table, 8, HEAD_DIM, 4)
    out = backend.forward(q, LAYER, backend.plan(layout))
    torch.testing.assert_close(out, reference.forward(q, LAYER, reference.plan(layout)), atol=1e-5, rtol=1e-5)


def test_auto_is_sdpa_on_cpu_and_torch_stays_the_reference():
    config = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=8, hidden_size=16, num_layers=1, num_q_heads=4,
        num_kv_heads=2, head_dim=4, intermediate_size=8, rms_norm_eps=1e-6, rope_theta=1e4,
        rope_scaling=None, max_position_embeddings=16, tie_word_embeddings=True, qk_norm=False,
        attention_bias=False, eos_token_ids=(0,),
    )  # fmt: skip
    args = dict(
        kv=KVPool(1, 4, 2, 2, 4, torch.float32, "cpu"),
        page_table=torch.zeros(2, 8, dtype=torch.int32),
        model_config=config,
        page_size=2,
        device="cpu",
    )
    assert type(create_backend("auto", **args)) is TorchSdpaBackend
    assert type(create_backend("sdpa", **args)) is TorchSdpaBackend
    assert type(create_backend("torch", **args)) is TorchRefBackend
