"""The MoE kernels' CPU paths (worker.kernels.moe) against float64 oracles written here:
routing (softmax, top-k, renormalisation), the expert loop in float32, bfloat16 and FP8 (the
oracle's own e4m3 rounding, per output channel and per token), the capture-safe variant;
the MoE block's FP8 quantization (worker.models.fp8)."""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_fp8_weights import fake_quant_rows
from worker.kernels.moe import every_expert, experts_loop, moe_experts, route

T, H, INTER, E, K = 37, 48, 40, 8, 2


def weights(
    dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=gen)
    w13 = (
        torch.randn(E, 2 * INTER, H, generator=gen) / H**0.5 * torch.logspace(-1, 1, 2 * INTER)[None, :, None]
    )
    w2 = torch.randn(E, H, INTER, generator=gen) / INTER**0.5
    logits = torch.randn(T, E, generator=gen) * 2
    return x.to(dtype), w13.to(dtype), w2.to(dtype), logits


def oracle_route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(logits.double(), dim=-1)
    order = probs.argsort(dim=-1, descending=True, stable=True)[:, :top_k]  # ties: the lowest expert first
    chosen = probs.gather(1, order)
    return (chosen / chosen.sum(-1, keepdim=True) if renormalize else chosen), order


def oracle_experts(x, w13, w2, topk_weights, topk_ids, quant=None) -> torch.Tensor:
    """float64, token by token; ``quant`` rounds each GEMM input per token (FP8)."""
    q = quant or (lambda t: t)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate_up = q(x[t : t + 1]).double() @ w13[e].double().t()
            gate, up = gate_up.chunk(2, dim=-1)
            hidden = torch.nn.functional.silu(gate) * up
            out[t] += float(topk_weights[t, j]) * (q(hidden.float()).double() @ w2[e].double().t())[0]
    return out


@pytest.mark.parametrize("renormalize", [True, False])
def test_route_is_softmax_then_top_k(renormalize: bool) -> None:
    _, _, _, logits = weights(torch.float32)
    got_w, got_ids = route(logits, K, renormalize)
    want_w, want_ids = oracle_route(logits, K, renormalize)
    assert got_w.dtype == torch.float32 and got_ids.dtype == torch.int32 and got_ids.shape == (T, K)
    assert torch.equal(got_ids.long(), want_ids)
    torch.testing.assert_close(got_w.double(), want_w, atol=1e-6, rtol=1e-6)
    if renormalize:
        torch.testing.assert_close(got_w.sum(-1), torch.ones(T))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_expert_loop_matches_the_oracle(dtype: torch.dtype, tol: float) -> None:
    x, w13, w2, logits = weights(dtype)
    topk_weights, topk_ids = route(logits, K, True)
    got = experts_loop(x, w13, w2, topk_weights, topk_ids)
    want = oracle_experts(x.float(), w13.float(), w2.float(), topk_weights, topk_ids)
    assert got.dtype == dtype and got.shape == (T, H)
    assert (got.double() - want).abs().max() / want.abs().max() < tol
    assert torch.equal(moe_experts(x, w13, w2, topk_weights, topk_ids), got)  # CPU: the loop itself
    torch.testing.assert_close(every_expert(x, w13, w2, topk_weights, topk_ids), got, atol=tol, rtol=tol)


def test_fp8_experts_match_the_oracle_scheme() -> None:
    """e4m3 weights with per-output-channel scales (fp8.quantize_channels), activations
    quantized per token before each GEMM: the oracle's fake-quantized float64 computation."""
    from worker.models.fp8 import quantize_channels

    x, w13, w2, logits = weights(torch.float32, seed=1)
    topk_weights, topk_ids = route(logits, K, False)
    (q13, s13), (q2, s2) = quantize_channels(w13), quantize_channels(w2)
    assert q13.dtype == torch.float8_e4m3fn and s13.shape == (E, 2 * INTER) and s2.shape == (E, H)
    got = experts_loop(x, q13, q2, topk_weights, topk_ids, w13_scale=s13, w2_scale=s2)
    want = oracle_experts(
        x, fake_quant_rows(w13), fake_quant_rows(w2), topk_weights, topk_ids, fake_quant_rows
    )
    plain = oracle_experts(x, w13, w2, topk_weights, topk_ids)
    err = (got.double() - want).abs().max() / want.abs().max()
    assert err < 1e-5, err
    assert (got.double() - plain).abs().max() / plain.abs().max() > 10 * err  # the scheme is what was run
    captured = every_expert(x, q13, q2, topk_weights, topk_ids, w13_scale=s13, w2_scale=s2)
    torch.testing.assert_close(captured, got, atol=1e-5, rtol=1e-5)


def test_the_float64_truth_is_the_unquantized_oracle() -> None:
    """tests.moe_oracle.float64_truth (what the GPU test and benchmarks/moe_kernel.py --truth
    measure FP8 arithmetic against): the oracle without activation quantization, on FP8 weights
    dequantized by their scales; the FP8 loop is measurably off it."""
    from tests.moe_oracle import float64_truth, truth_errors
    from worker.models.fp8 import quantize_channels

    x, w13, w2, logits = weights(torch.float32, seed=2)
    topk_weights, topk_ids = route(logits, K, True)
    want = oracle_experts(x, w13, w2, topk_weights, topk_ids)
    # (the oracle rounds its intermediate to float32: 1e-5)
    torch.testing.assert_close(float64_truth(x, w13, w2, topk_weights, topk_ids), want, atol=1e-5, rtol=1e-4)
    (q13, s13), (q2, s2) = quantize_channels(w13), quantize_channels(w2)
    truth = float64_truth(x, q13, q2, topk_weights, topk_ids, s13, s2)
    dequantized = oracle_experts(x, q13.double() * s13.double()[..., None], q2.double() * s2.double()[..., None],
                                 topk_weights, topk_ids)  # fmt: skip
    torch.testing.assert_close(truth, dequantized, atol=1e-5, rtol=1e-4)
    loop = experts_loop(x, q13, q2, topk_weights, topk_ids, w13_scale=s13, w2_scale=s2)
    rms, worst = truth_errors(loop, truth)
    assert 1e-3 < rms < 1e-1 and rms <= worst * 10


def test_quantize_model_puts_experts_in_fp8(tmp_path) -> None:
    from tests.family_fixtures import family_dir
    from worker.models.loader import load_model
    from worker.models.moe import SparseMoE

    family_dir("qwen3_moe", tmp_path)  # 3 layers, layer 1 dense (mlp_only_layers)
    loaded = load_model(str(tmp_path), quantization="fp8")
    blocks = [m for m in loaded.model.modules() if isinstance(m, SparseMoE)]
    assert len(blocks) == 2
    for block in blocks:
        assert block.w13.dtype == torch.float8_e4m3fn and block.w2.dtype == torch.float8_e4m3fn
        assert block.w13_scale is not None and block.w13_scale.shape == (8, 64)
        assert block.gate.weight.dtype == torch.float32  # the router stays in the model dtype


def test_an_engine_with_moe_layers_refuses_a_bad_tiles_file_at_start(tmp_path, monkeypatch) -> None:
    """RADIXQ_MOE_TILES that is not a table of tiles: the engine of a MoE model stops while it is
    built, naming the variable and the file (not at its first MoE step); a dense model does not
    read it."""
    from tests.family_fixtures import tiny_config
    from worker.kernels.moe_tiles import TILES_ENV
    from worker.llm import LLM

    bad = tmp_path / "tiles.json"
    bad.write_text('{"128,2048,768,fp8": "not buckets"}')
    monkeypatch.setenv(TILES_ENV, str(bad))
    for kind in ("qwen3_moe", "mistral"):
        model_dir = tmp_path / kind
        model_dir.mkdir()
        tiny_config(kind).to_json_file(model_dir / "config.json")
        if kind == "qwen3_moe":
            with pytest.raises(ValueError, match=f"{TILES_ENV}={bad}: not a table of MoE tiles"):
                LLM(str(model_dir), device="cpu", load_format="dummy", page_size=4)
        else:
            LLM(str(model_dir), device="cpu", load_format="dummy", page_size=4)
