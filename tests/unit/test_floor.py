"""benchmarks/floor.py against hand computations: a small shape worked through step by step, and
the at-scale shapes against their closed forms (uniform requests: the sum of live context is
n * (m * p + m * (m - 1) / 2))."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from floor import ModelShape, decode_steps, shape_floor  # noqa: E402

# 2 layers, hidden 8, 2 query heads / 1 KV head of 4 dims, MLP 16, vocab 32.
SMALL = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32)
PROMPTS, OUTPUTS = [3, 5], [2, 1]
BANDWIDTH, PEAK = 1000.0, 1500.0  # bytes/s and FLOP/s, chosen so one step is compute-bound


def test_small_shape_counts():
    # per layer: qkv 8 * (2 + 2 * 1) * 4 = 128, o 2 * 4 * 8 = 64, MLP 3 * 8 * 16 = 384 -> 576
    assert SMALL.body_params == 2 * 576 == 1152
    assert SMALL.matmul_params == 1152 + 32 * 8 == 1408  # + the LM head
    assert SMALL.kv_elements_per_token == 2 * 2 * 1 * 4 == 16  # layers x (k, v) x kv heads x dims
    assert SMALL.attn_flops_per_context_token == 2 * 4 * 2 * 4 == 64


def test_small_shape_floor_by_hand():
    f = shape_floor(SMALL, PROMPTS, OUTPUTS, kv_bytes=2, bandwidth=BANDWIDTH, peak=PEAK)
    # Both requests run at once. Step 0: 2 requests, context 3 + 5 = 8; step 1: request 0 alone,
    # context 4 (request 1's single output token was its only step).
    # weights 2 * 1408 = 2816 bytes; KV 16 elements * 2 bytes = 32 bytes per context token.
    # step 0: memory (2816 + 8 * 32) / 1000 = 3.072 s; compute (2 * 1408 * 2 + 64 * 8) / 1500
    #         = 6144 / 1500 = 4.096 s -> compute-bound, 4.096 s
    # step 1: memory (2816 + 4 * 32) / 1000 = 2.944 s; compute (2816 + 256) / 1500 = 2.048 s -> 2.944 s
    assert f.steps == 2 and f.compute_bound_steps == 1
    assert f.decode_s == pytest.approx(4.096 + 2.944)
    # prefill: 2 * 1152 * 3 + 64 * 3^2 / 2 + 2 * 1152 * 5 + 64 * 5^2 / 2 = 6912 + 288 + 11520 + 800
    assert f.prefill_s == pytest.approx(19520 / 1500)
    assert f.weights_s == pytest.approx(2 * 2.816)
    assert f.kv_s == pytest.approx((8 + 4) * 32 / 1000)
    assert f.compute_s == pytest.approx((6144 + 3072 + 19520) / 1500)
    assert f.total_s == pytest.approx(7.04 + 19520 / 1500)
    assert f.overlap_s == pytest.approx(f.compute_s)  # 19.16 s of FLOPs > 6.02 s of bytes
    assert f.tok_per_s == pytest.approx(3 / f.total_s)


def test_fp8_kv_halves_the_kv_bytes_only():
    f = shape_floor(SMALL, PROMPTS, OUTPUTS, kv_bytes=1, bandwidth=BANDWIDTH, peak=PEAK)
    # KV 16 bytes per token. step 0: memory (2816 + 128) / 1000 = 2.944 < compute 4.096;
    # step 1: memory (2816 + 64) / 1000 = 2.88 > compute 2.048.
    assert f.kv_s == pytest.approx(12 * 16 / 1000)
    assert f.weights_s == pytest.approx(2 * 2.816)
    assert f.decode_s == pytest.approx(4.096 + 2.88)


def test_one_running_request_at_a_time():
    # request 0: contexts 3, 4; then request 1: context 5
    assert decode_steps(PROMPTS, OUTPUTS, max_running=1) == [(1, 3), (1, 4), (1, 5)]
    f = shape_floor(SMALL, PROMPTS, OUTPUTS, max_running=1, bandwidth=BANDWIDTH, peak=PEAK)
    assert f.weights_s == pytest.approx(3 * 2.816)  # three steps read the weights
    assert f.kv_s == pytest.approx((3 + 4 + 5) * 32 / 1000)  # the same KV reads as at once


def test_kv_capacity_reserves_each_whole_request():
    # request 0 needs 3 + 2 = 5 tokens, request 1 needs 5 + 1 = 6: 11 fit together, 10 do not
    assert decode_steps(PROMPTS, OUTPUTS, max_running=2, kv_capacity_tokens=11) == [(2, 8), (1, 4)]
    assert decode_steps(PROMPTS, OUTPUTS, max_running=2, kv_capacity_tokens=10) == [(1, 3), (1, 4), (1, 5)]
    with pytest.raises(ValueError, match="exceeds the KV capacity"):
        decode_steps(PROMPTS, OUTPUTS, max_running=2, kv_capacity_tokens=4)


def test_a_freed_slot_is_taken_at_the_next_step():
    # three requests, two slots: request 2 starts when request 1 (one step) is done
    steps = decode_steps([10, 20, 30], [3, 1, 2], max_running=2)
    assert steps == [(2, 30), (2, 11 + 30), (2, 12 + 31)]


@pytest.mark.parametrize(
    ("config", "kv_bytes"), [("llama-3.1-8b", 2), ("llama-3.1-8b", 1), ("qwen3-0.6b", 2)]
)
def test_at_scale_shape_matches_its_closed_form(config: str, kv_bytes: int):
    cfg = json.loads((REPO / "configs" / f"{config}.json").read_text())
    n, p, m = 1024, 1000, 1000
    f = shape_floor(ModelShape.from_config(cfg), [p] * n, [m] * n, kv_bytes=kv_bytes)
    L, d = cfg["num_hidden_layers"], cfg["head_dim"]
    h, kvh, inter, vocab = (
        cfg["hidden_size"],
        cfg["num_key_value_heads"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    )
    body = L * (
        h * (cfg["num_attention_heads"] + 2 * kvh) * d + cfg["num_attention_heads"] * d * h + 3 * h * inter
    )
    context_tokens = n * (m * p + m * (m - 1) // 2)  # sum over the 1,000 steps of the live context
    kv_token_bytes = L * 2 * kvh * d * kv_bytes
    assert f.steps == m
    assert f.weights_s == pytest.approx(m * 2 * (body + vocab * h) / 4.3e12)
    assert f.kv_s == pytest.approx(context_tokens * kv_token_bytes / 4.3e12)
    attn = L * 4 * cfg["num_attention_heads"] * d
    assert f.prefill_s == pytest.approx(n * (2 * body * p + attn * p * p / 2) / 790e12)
    if config == "llama-3.1-8b" and kv_bytes == 2:
        # 128 KiB of KV per token; 1.5 G context tokens read: 46.8 s at 4.3 TB/s
        assert kv_token_bytes == 131072 and f.kv_s == pytest.approx(46.80, abs=0.01)
