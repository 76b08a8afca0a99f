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

from floor import ModelShape, causal_pairs, decode_steps, shape_floor  # noqa: E402

# 2 layers, hidden 8, 2 query heads / 1 KV head of 4 dims, MLP 16, vocab 32.
SMALL = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32)
PROMPTS, OUTPUTS = [3, 5], [2, 1]
BANDWIDTH, PEAK = 1000.0, 1500.0  # bytes/s and FLOP/s, chosen so one step is compute-bound


def pairs(steps: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """(running, context) of each step, the windowed sum left out."""
    return [(batch, context) for batch, context, _ in steps]


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
    # request 0: contexts 3, 4; then request 1: context 5 (no window: the capped sum is the sum)
    assert decode_steps(PROMPTS, OUTPUTS, max_running=1) == [(1, 3, 3), (1, 4, 4), (1, 5, 5)]
    f = shape_floor(SMALL, PROMPTS, OUTPUTS, max_running=1, bandwidth=BANDWIDTH, peak=PEAK)
    assert f.weights_s == pytest.approx(3 * 2.816)  # three steps read the weights
    assert f.kv_s == pytest.approx((3 + 4 + 5) * 32 / 1000)  # the same KV reads as at once


def test_kv_capacity_reserves_each_whole_request():
    # request 0 needs 3 + 2 = 5 tokens, request 1 needs 5 + 1 = 6: 11 fit together, 10 do not
    assert pairs(decode_steps(PROMPTS, OUTPUTS, max_running=2, kv_capacity_tokens=11)) == [(2, 8), (1, 4)]
    assert pairs(decode_steps(PROMPTS, OUTPUTS, max_running=2, kv_capacity_tokens=10)) == [
        (1, 3),
        (1, 4),
        (1, 5),
    ]
    with pytest.raises(ValueError, match="exceeds the KV capacity"):
        decode_steps(PROMPTS, OUTPUTS, max_running=2, kv_capacity_tokens=4)


def test_a_freed_slot_is_taken_at_the_next_step():
    # three requests, two slots: request 2 starts when request 1 (one step) is done
    steps = decode_steps([10, 20, 30], [3, 1, 2], max_running=2)
    assert pairs(steps) == [(2, 30), (2, 11 + 30), (2, 12 + 31)]


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


# The SMALL attention with two MoE layers of 4 experts (top-2, expert MLP 6) instead of the MLP.
MOE = ModelShape(
    layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32,
    num_experts=4, top_k=2, expert_intermediate=6, moe_layers=2,
)  # fmt: skip


def test_moe_shape_counts():
    # attention 2 x (128 + 64) = 384; one expert 3 * 8 * 6 = 144; no dense MLP layer left
    assert MOE.attention_params == 384 and MOE.expert_params == 144 and MOE.dense_mlp_params == 0
    assert MOE.body_params == 384 + 2 * 4 * 144 == 1536  # every expert of both layers
    assert MOE.active_body_params == 384 + 2 * 2 * 144 == 960  # a token's two experts
    assert MOE.head_params == 32 * 8 + 2 * 8 * 4 == 320  # LM head + two 8 x 4 routers
    # uniform top-2 of 4: a token misses an expert with probability 1/2
    assert [MOE.active_experts(b) for b in (1, 2, 3)] == [2.0, 3.0, 3.5]
    assert MOE.step_body_params(2) == 384 + 2 * 3 * 144 == 1248


@pytest.mark.parametrize("fp8", [False, True])
def test_moe_floor_reads_only_the_selected_experts(fp8: bool):
    f = shape_floor(MOE, PROMPTS, OUTPUTS, kv_bytes=2, fp8_weights=fp8, bandwidth=BANDWIDTH, peak=PEAK)
    # Steps as in test_small_shape_floor_by_hand: (2 running, context 8), (1 running, context 4).
    # KV 32 bytes per context token. Weight bytes: layers x (1 or 2) + head 2 x 320 = 640.
    if not fp8:
        # step 0: (2 * 1248 + 640 + 8 * 32) / 1000 = 3.392 s; compute (2 * 960 * 2 + 2 * 320 * 2
        #         + 64 * 8) / 1500 = 5632 / 1500 = 3.7547 s -> compute-bound
        # step 1: (2 * 960 + 640 + 4 * 32) / 1000 = 2.688 s; compute 2816 / 1500 = 1.877 s
        assert f.weights_s == pytest.approx((3136 + 2560) / 1000)
        assert f.decode_s == pytest.approx(5632 / 1500 + 2.688)
        # prefill: 2 * 960 * 3 + 64 * 9 / 2 + 2 * 960 * 5 + 64 * 25 / 2 = 16448 FLOPs
        assert f.prefill_s == pytest.approx(16448 / 1500)
        assert f.weight_bytes == 2 * 1536 + 640
    else:
        # step 0: (1248 + 640 + 256) / 1000 = 2.144 s; compute 3840 / 3000 + (1280 + 512) / 1500
        #         = 2.4747 s -> compute-bound; step 1: (960 + 640 + 128) / 1000 = 1.728 s against
        #         1920 / 3000 + (640 + 256) / 1500 = 1.2373 s
        assert f.weights_s == pytest.approx((1888 + 1600) / 1000)
        assert f.decode_s == pytest.approx(3840 / 3000 + 1792 / 1500 + 1.728)
        assert f.prefill_s == pytest.approx((2 * 960 * 8) / 3000 + (288 + 800) / 1500)
    assert f.compute_bound_steps == 1


def test_moe_configs_are_read_from_config_json():
    qwen = ModelShape.from_config(json.loads((REPO / "configs" / "qwen3-30b-a3b.json").read_text()))
    assert (qwen.num_experts, qwen.top_k, qwen.expert_intermediate, qwen.moe_layers) == (128, 8, 768, 48)
    assert qwen.dense_mlp_params == 0 and (qwen.heads, qwen.kv_heads, qwen.head_dim) == (32, 4, 128)
    # 30.5B parameters in all (embeddings aside: 30.5B - 151936 * 2048 = 30.2B), 3.3B active
    assert qwen.matmul_params == pytest.approx(30.22e9, rel=1e-3)
    assert qwen.active_body_params + qwen.head_params == pytest.approx(3.04e9, rel=1e-2)
    mixtral = ModelShape.from_config(json.loads((REPO / "configs" / "mixtral-8x7b.json").read_text()))
    assert (mixtral.num_experts, mixtral.top_k, mixtral.expert_intermediate, mixtral.moe_layers) == (
        8,
        2,
        14336,
        32,
    )
    assert mixtral.matmul_params == pytest.approx(46.57e9, rel=1e-3)  # 46.7B with the embeddings
    gemma = ModelShape.from_config(json.loads((REPO / "configs" / "gemma-3-12b.json").read_text()))
    assert (gemma.layers, gemma.hidden, gemma.head_dim, gemma.vocab, gemma.num_experts) == (
        48,
        3840,
        256,
        262208,
        0,
    )


def test_moe_at_scale_by_its_closed_form():
    """Qwen3-30B-A3B, 1,024 x 1,000/1,000 with FP8 weights and KV: every step has 1,024 running,
    so each reads 128 * (1 - (15/16)^1024) experts per layer (all 128 to 1e-26)."""
    cfg = json.loads((REPO / "configs" / "qwen3-30b-a3b.json").read_text())
    n, p, m = 1024, 1000, 1000
    f = shape_floor(ModelShape.from_config(cfg), [p] * n, [m] * n, kv_bytes=1, fp8_weights=True)
    attention = 48 * (2048 * (32 + 2 * 4) * 128 + 32 * 128 * 2048)
    experts = 48 * 128 * 3 * 2048 * 768
    head = 151936 * 2048 + 48 * 2048 * 128
    assert f.weights_s == pytest.approx(m * (attention + experts + 2 * head) / 4.3e12)
    kv_token_bytes = 48 * 2 * 4 * 128  # FP8: one byte each
    assert f.kv_s == pytest.approx(n * (m * p + m * (m - 1) // 2) * kv_token_bytes / 4.3e12)
    one = shape_floor(ModelShape.from_config(cfg), [p], [m], kv_bytes=1, fp8_weights=True)
    # one request alone reads exactly its 8 experts per layer at every step
    assert one.weights_s == pytest.approx(m * (attention + 48 * 8 * 3 * 2048 * 768 + 2 * head) / 4.3e12)


def test_windowed_context_caps_each_request_at_the_window():
    # window 5. Request 0 (prompt 3, 4 steps): contexts 3, 4, 5, 6 -> capped 3, 4, 5, 5;
    # request 1 (prompt 5, 2 steps): 5, 6 -> 5, 5; request 2 (prompt 7 > window, 1 step) takes
    # request 1's slot at step 2: 7 -> 5.
    assert decode_steps([3, 5], [4, 2], max_running=2, window=5) == [
        (2, 8, 8),
        (2, 10, 9),
        (1, 5, 5),
        (1, 6, 5),
    ]
    three = decode_steps([3, 5, 7], [4, 2, 1], max_running=2, window=5)
    assert three == [(2, 8, 8), (2, 10, 9), (2, 12, 10), (1, 6, 5)]
    # prefill: a query sees at most 5 keys: 5^2 / 2 + 3 * 5 pairs for 8 tokens
    assert causal_pairs(8, 5) == 27.5 and causal_pairs(4, 5) == causal_pairs(4) == 8


def test_window_layers_read_only_their_window_of_kv():
    # SMALL with layer 0 windowed (5 tokens), layer 1 full: per layer 2 x 1 x 4 = 8 KV elements a token
    shape = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32,
                       window=5, window_layers=1)  # fmt: skip
    f = shape_floor(shape, [3, 5], [4, 2], kv_bytes=2, bandwidth=BANDWIDTH, peak=PEAK)
    # context tokens read over both layers: (8 + 8) + (10 + 9) + (5 + 5) + (6 + 5) = 56, 16 bytes each
    assert f.kv_s == pytest.approx(56 * 16 / 1000)
    # prefill attention: 4 x 2 heads x 4 dims = 32 FLOPs per (query, key) pair a layer; prompts 3
    # and 5 fit the window, so both layers count 3^2 / 2 + 5^2 / 2 pairs
    assert f.prefill_s == pytest.approx((2 * 1152 * 8 + 32 * 2 * (4.5 + 12.5)) / 1500)
    wide = shape_floor(shape, [8], [1], kv_bytes=2, bandwidth=BANDWIDTH, peak=PEAK)
    # a prompt of 8: the windowed layer counts 27.5 pairs, the full one 32
    assert wide.prefill_s == pytest.approx((2 * 1152 * 8 + 32 * (27.5 + 32)) / 1500)


def test_gemma3_windows_five_of_every_six_layers():
    cfg = json.loads((REPO / "configs" / "gemma-3-12b.json").read_text())
    gemma = ModelShape.from_config(cfg)
    assert (gemma.window, gemma.window_layers) == (1024, 40)  # layers 6, 12, ..., 48 are global
    qwen = ModelShape.from_config(json.loads((REPO / "configs" / "qwen3-8b.json").read_text()))
    assert (qwen.window, qwen.window_layers) == (0, 0)
    mistral = ModelShape.from_config({**cfg["text_config"], "model_type": "mistral", "sliding_window": 4096})
    assert (mistral.window, mistral.window_layers) == (4096, 48)


def test_measured_ceilings_are_rates_and_the_card_floor_follows_them():
    """measure_ceilings on this CPU (smoke sizes): a copy rate and a GEMM rate, both positive;
    at_scale's third floor is shape_floor at those ceilings: equal to the H200 floor at the
    H200's ceilings, and longer on a card with half the bandwidth and peak."""
    from at_scale import PRESETS
    from at_scale_report import floors
    from floor import H200_BANDWIDTH, H200_PEAK, measure_ceilings

    bandwidth, peak = measure_ceilings(reps=2)
    assert bandwidth > 1e8 and peak > 1e8
    preset = PRESETS["llama-3.1-8b"]
    ideal, _, same = floors(preset, "fp8_e4m3", 1024, None, True, (H200_BANDWIDTH, H200_PEAK))
    assert same is not None and same.total_s == pytest.approx(ideal.total_s)
    _, _, slower = floors(preset, "fp8_e4m3", 1024, None, True, (H200_BANDWIDTH / 2, H200_PEAK / 2))
    assert slower is not None and slower.total_s == pytest.approx(2 * ideal.total_s)
    assert floors(preset, "fp8_e4m3", 1024, None, True)[2] is None
