"""Cascade attention (TorchCascadeBackend) equals the plain torch reference, on random data.

Rows of grouped requests begin with the very same KV pages (as the radix cache leaves them);
the cascade attends to those once per group and merges by log-sum-exp. The oracle is
TorchRefBackend over the same page table (itself checked against dense attention in
test_attention_torch_ref.py), and a float64 dense softmax for the merge on its own.
"""

from __future__ import annotations

import pytest
import torch

from tests.cascade_scenario import DECODE, PREFILL, PREFIX_PAGES, A, B, scenario
from worker.attention.registry import create_backend
from worker.attention.torch_cascade import TorchCascadeBackend, attend_with_lse, merge_states
from worker.attention.torch_ref import TorchRefBackend
from worker.kvcache.pool import KVPool
from worker.models.config import ModelConfig


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(4, 4), (8, 2)])
@pytest.mark.parametrize(
    "requests", [DECODE, PREFILL, DECODE[:3] + PREFILL[:4]], ids=["decode", "prefill", "mixed"]
)
def test_cascade_equals_reference(page_size, num_q_heads, num_kv_heads, requests):
    """Two groups (members not adjacent in the batch), requests in none, decode and prefill
    over a cached prefix: the cascade's output equals the plain reference within 1e-5."""
    kv, page_table, plain, grouped, q, layer = scenario(
        requests, page_size, num_q_heads, num_kv_heads, page_size
    )
    reference = TorchRefBackend(kv, page_table, num_q_heads, 16, page_size)
    cascade = TorchCascadeBackend(kv, page_table, num_q_heads, 16, page_size)
    expected = reference.forward(q, layer, reference.plan(plain))
    got = cascade.forward(q, layer, cascade.plan(grouped))
    assert grouped.prefix_groups is not None and grouped.prefix_groups.num_groups == 2
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    # without groups it is the reference path itself
    torch.testing.assert_close(cascade.forward(q, layer, cascade.plan(plain)), expected, rtol=0, atol=0)


def test_cascade_reads_only_the_shared_pages_once():
    """The plan attends each group's prefix once: one prefix entry per group, and each
    member's own part starts past the prefix (so the shared KV is not read per request)."""
    kv, page_table, _, grouped, _, _ = scenario(DECODE, 16, 4, 4, 3)
    plan = TorchCascadeBackend(kv, page_table, 4, 16, 16).plan(grouped)
    assert [len(g.kv_locs) for g in plan.groups] == [PREFIX_PAGES[A] * 16, PREFIX_PAGES[B] * 16]
    seq_lens = grouped.seq_lens_cpu.tolist()
    prefix = grouped.prefix_groups.prefix_lens_cpu.tolist()
    assert [len(s.kv_locs) for s in plan.suffixes] == [s - p for s, p in zip(seq_lens, prefix, strict=True)]


def test_merge_of_two_key_sets_equals_attention_over_both():
    """merge_states(attend(A), attend(B)) == attend(A + B), float64 dense softmax as oracle."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(3, 2, 8, generator=gen)
    k = torch.randn(11, 2, 8, generator=gen)
    v = torch.randn(11, 2, 8, generator=gen)
    o_a, s_a = attend_with_lse(q, k[:4], v[:4], None, 0.3)
    o_b, s_b = attend_with_lse(q, k[4:], v[4:], None, 0.3)
    merged, lse = merge_states(o_a, s_a, o_b, s_b)
    scores = torch.einsum("ehd,shd->hes", q.double(), k.double()) * 0.3
    dense = torch.einsum("hes,shd->ehd", torch.softmax(scores, -1), v.double())
    torch.testing.assert_close(merged.double(), dense, rtol=0, atol=1e-6)
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1).transpose(0, 1), rtol=0, atol=1e-5)


def test_registry_builds_the_cascade_variant():
    kv = KVPool(1, 4, 16, 2, 16, torch.float32, "cpu")
    mc = ModelConfig(
        architecture="LlamaForCausalLM",
        vocab_size=8,
        hidden_size=64,
        num_layers=1,
        num_q_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=8,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        rope_scaling=None,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        qk_norm=False,
        attention_bias=False,
        eos_token_ids=(0,),
    )
    args = dict(
        kv=kv, page_table=torch.zeros(2, 16, dtype=torch.int32), model_config=mc, page_size=16, device="cpu"
    )
    assert type(create_backend("torch", **args)) is TorchRefBackend
    backend = create_backend("torch", cascade=True, **args)
    assert isinstance(backend, TorchCascadeBackend) and backend.supports_cascade
