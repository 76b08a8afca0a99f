"""The fused MoE kernel (worker.kernels.fused_moe) on CUDA at the published expert shapes of
Qwen3-30B-A3B and Mixtral-8x7B, bf16 and FP8 experts, against the float32 expert loop of
tests/moe_oracle.py (activations quantized per row for FP8): max |error| / max |reference|
<= 1e-2; and under CUDA-graph capture and replay with new routing in the same buffers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.moe_oracle import moe_reference, quantize_experts, relative_error, uniform_routing  # noqa: E402

pytestmark = pytest.mark.gpu

# name -> (experts, top-k, hidden, intermediate) as in the models' config.json
SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "mixtral-8x7b": (8, 2, 4096, 14336)}


@pytest.fixture(scope="module", autouse=True)
def cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.fixture(scope="module", params=list(SHAPES))
def layer(request):
    """(name, shape, bf16 experts, FP8 experts) of one model's expert shape."""
    num_experts, top_k, hidden, inter = SHAPES[request.param]
    gen = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, device="cuda", generator=gen) / hidden**0.5).bfloat16()
    w2 = (torch.randn(num_experts, hidden, inter, device="cuda", generator=gen) / inter**0.5).bfloat16()
    fp8 = (*quantize_experts(w13), *quantize_experts(w2))  # w13_q, w13_scale, w2_q, w2_scale
    yield request.param, SHAPES[request.param], (w13, w2), fp8
    del w13, w2, fp8
    torch.cuda.empty_cache()


def run(weights, fp8: bool, x, topk_weights, topk_ids):
    """(fused_moe's output, the loop's) for one call."""
    from worker.kernels.fused_moe import fused_moe

    if fp8:
        w13_q, w13_scale, w2_q, w2_scale = weights
        got = fused_moe(x, w13_q, w2_q, topk_weights, topk_ids, w13_scale=w13_scale, w2_scale=w2_scale)
        return got, moe_reference(x, w13_q, w2_q, topk_weights, topk_ids, w13_scale, w2_scale)
    w13, w2 = weights
    return fused_moe(x, w13, w2, topk_weights, topk_ids), moe_reference(x, w13, w2, topk_weights, topk_ids)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("num_tokens", [1, 64, 1024, 4096])
def test_matches_the_expert_loop(layer, fp8: bool, num_tokens: int):
    name, (num_experts, top_k, hidden, _), bf16_weights, fp8_weights = layer
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, hidden, generator=gen).bfloat16().cuda()
    topk_weights, topk_ids = uniform_routing(num_tokens, num_experts, top_k, gen, device="cuda")
    got, want = run(fp8_weights if fp8 else bf16_weights, fp8, x, topk_weights, topk_ids)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    error = relative_error(got, want)
    assert error <= 1e-2, f"{name} {num_tokens} tokens {'fp8' if fp8 else 'bf16'}: relative error {error:.2e}"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_every_token_on_the_same_experts(layer, fp8: bool):
    """All 1,024 tokens pick experts 0..k-1: one run of many blocks per expert, the rest empty."""
    _, (num_experts, top_k, hidden, _), bf16_weights, fp8_weights = layer
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1024, hidden, generator=gen).bfloat16().cuda()
    topk_ids = torch.arange(top_k, dtype=torch.int32).repeat(1024, 1).cuda()
    topk_weights = torch.rand(1024, top_k, generator=gen).cuda()
    got, want = run(fp8_weights if fp8 else bf16_weights, fp8, x, topk_weights, topk_ids)
    assert relative_error(got, want) <= 1e-2


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_cuda_graph_replays_new_routing(layer, fp8: bool):
    """Captured once on static buffers (a 64-token decode step), replayed after new tokens and
    new routing are copied in: the same values as an eager call on those inputs, bit for bit."""
    from worker.kernels.fused_moe import fused_moe

    _, (num_experts, top_k, hidden, _), bf16_weights, fp8_weights = layer
    if fp8:
        w13, w13_scale, w2, w2_scale = fp8_weights
        scales = dict(w13_scale=w13_scale, w2_scale=w2_scale)
    else:
        (w13, w2), scales = bf16_weights, {}
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(64, hidden, generator=gen).bfloat16().cuda()
    topk_weights, topk_ids = uniform_routing(64, num_experts, top_k, gen, device="cuda")
    fused_moe(x, w13, w2, topk_weights, topk_ids, **scales)  # compiles the kernels outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, topk_weights, topk_ids, **scales)
    for seed in (12, 13):
        gen = torch.Generator().manual_seed(seed)
        new_weights, new_ids = uniform_routing(64, num_experts, top_k, gen, device="cuda")
        x.copy_(torch.randn(64, hidden, generator=gen).bfloat16())
        topk_weights.copy_(new_weights)
        topk_ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        eager = fused_moe(x, w13, w2, topk_weights, topk_ids, **scales)
        assert torch.equal(out, eager), f"seed {seed}: the replay differs from an eager call"
        reference = moe_reference(
            x, w13, w2, topk_weights, topk_ids, scales.get("w13_scale"), scales.get("w2_scale")
        )
        assert relative_error(out, reference) <= 1e-2
