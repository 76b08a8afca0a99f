"""The MoE routing and the expert loop on CUDA (worker.kernels.moe): both capture in a CUDA
graph (route has no host sync; the loop switches to every_expert while capturing) and the
replay equals the eager loop; the engine's ``triton = false`` path for MoE models; the fused
router kernel against torch's softmax and top-k, eager and replayed."""

from __future__ import annotations

import pytest
import torch

from worker.kernels.moe import experts_loop, route
from worker.kernels.ops import triton_scope

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fp8", [False, True])
def test_route_and_loop_capture_in_a_cuda_graph(fp8: bool) -> None:
    from worker.models.fp8 import quantize_channels

    gen = torch.Generator(device="cuda").manual_seed(0)
    t, h, inter, e = 24, 256, 128, 8
    x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * inter, h, device="cuda", generator=gen) / h**0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, inter, device="cuda", generator=gen) / inter**0.5).to(torch.bfloat16)
    gate = (torch.randn(e, h, device="cuda", generator=gen) / h**0.5).to(torch.bfloat16)
    scales: dict[str, torch.Tensor] = {}
    if fp8:
        (w13, scales["w13_scale"]), (w2, scales["w2_scale"]) = quantize_channels(w13), quantize_channels(w2)

    def step() -> torch.Tensor:
        weights, ids = route(x @ gate.t(), 2, True)
        return experts_loop(x, w13, w2, weights, ids, **scales)

    with triton_scope(False):
        eager = step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("num_experts", "top_k"), [(8, 2), (128, 8)])
def test_fused_route_matches_torch_and_replays_in_a_graph(num_experts: int, top_k: int) -> None:
    """route with Triton on (worker.kernels.fused_moe.fused_route, one kernel) against route with
    it off (torch softmax and top-k) on float32 logits (no ties), then captured once and
    replayed on new logits in the same buffer: the eager values."""
    gen = torch.Generator(device="cuda").manual_seed(num_experts)
    logits = torch.randn(1024, num_experts, device="cuda", generator=gen) * 2
    with triton_scope(False):
        want_weights, want_ids = route(logits, top_k, True)
    weights, ids = route(logits, top_k, True)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = route(logits, top_k, True)
    logits.copy_(torch.randn(1024, num_experts, device="cuda", generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    eager = route(logits, top_k, True)
    assert torch.equal(captured[1], eager[1]) and torch.equal(captured[0], eager[0])
