"""FP8 weights (``quantization = "fp8"``) on CPU: the emulated GEMM against its definition, and
the whole model against transformers running the same scheme through hooks written here.

The oracle quantizes on its own: each projection weight per output channel (scale =
max|W[n]| / 448, e4m3 by torch's cast) and each projection input per token (scale =
max|x[t]| / 448) before an fp64 matmul, or, for the model, before transformers' own float32
forward. radixq fuses q/k/v and gate/up into one matrix each; per-row scales make that the
same quantization as the separate matrices the oracle sees.
"""

from __future__ import annotations

import pytest
import torch

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.kernels import ops
from worker.models.fp8 import Fp8Linear, quantize_model

FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    """x with each row rounded to e4m3 at scale max|row| / 448 (the oracle's own version)."""
    scale = x.abs().amax(dim=-1, keepdim=True).double() / E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return ((x.double() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8).double() * scale).to(x.dtype)


def test_fp8_linear_is_the_scaled_e4m3_product() -> None:
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(96, 40, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(40, 96, generator=gen) * torch.logspace(-3, 1, 40)[:, None])
        linear.bias.copy_(torch.randn(40, generator=gen))
    x = torch.randn(7, 96, generator=gen) * torch.logspace(-2, 2, 7)[:, None]
    fp8 = Fp8Linear.from_linear(linear)
    assert fp8.weight.dtype == FP8 and fp8.weight_scale.shape == (40,)
    want = fake_quant_rows(x).double() @ fake_quant_rows(linear.weight.detach()).double().t()
    want = want + linear.bias.detach().double()
    got = fp8(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    # and it is really quantized: far from the float32 product at FP8's precision
    exact = linear(x).double()
    rel = (got.double() - exact).norm() / exact.norm()
    assert 1e-3 < rel < 0.1, rel


def test_prequantized_rows_give_the_same_product() -> None:
    """The fused norm / SiLU-mul ops hand over Fp8Rows; the GEMM reads them as they are."""
    gen = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(64, 32, bias=False)
    fp8 = Fp8Linear.from_linear(linear)
    x = torch.randn(5, 2 * 64, generator=gen)
    rows = ops.silu_and_mul(x, fp8=True)
    assert isinstance(rows, ops.Fp8Rows) and rows.data.dtype == FP8
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(fp8(rows), fp8(torch.nn.functional.silu(gate) * up))


def test_zero_rows_and_empty_batches() -> None:
    fp8 = Fp8Linear.from_linear(torch.nn.Linear(16, 8, bias=False))
    out = fp8(torch.zeros(3, 16))
    assert torch.equal(out, torch.zeros(3, 8))
    assert fp8(torch.zeros(0, 16)).shape == (0, 8)


def test_quantize_model_replaces_the_projections_only(tmp_path) -> None:
    from worker.models.config import ModelConfig
    from worker.models.decoder import CausalLM

    tiny_hf_model("qwen2").config.save_pretrained(tmp_path)
    cfg = ModelConfig.from_hf_dir(tmp_path)
    model = CausalLM(cfg, torch.float32, "cpu")
    assert quantize_model(model, "fp8") == 4 * cfg.num_layers
    assert isinstance(model.model.layers[0].self_attn.qkv_proj, Fp8Linear)
    assert isinstance(model.model.embed_tokens, torch.nn.Embedding)
    with pytest.raises(ValueError, match="quantization='int3'"):
        quantize_model(model, "int3")


def _fp8_oracle(hf: torch.nn.Module) -> torch.nn.Module:
    """transformers' model with the FP8 scheme applied: weights rounded per output channel,
    each projection's input rounded per token by a forward pre-hook."""
    for name, module in hf.named_modules():
        if name.rsplit(".", 1)[-1] in PROJECTIONS:
            with torch.no_grad():
                module.weight.copy_(fake_quant_rows(module.weight))
            module.register_forward_pre_hook(lambda _m, args: (fake_quant_rows(args[0]),))
    return hf


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_fp8_model_matches_transformers_with_the_same_scheme(kind: str, tmp_path) -> None:
    """Greedy tokens of the FP8 engine equal transformers' under the oracle's FP8 scheme, and
    its logits stay close; the unquantized model's logits are measurably further away."""
    from worker.llm import LLM

    hf = tiny_hf_model(kind, spread=0.2)
    hf.save_pretrained(tmp_path)
    oracle = _fp8_oracle(tiny_hf_model(kind, spread=0.2))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 250, (n,), generator=gen).tolist() for n in (5, 17, 33)]
    llm = LLM(str(tmp_path), device="cpu", quantization="fp8", max_running_reqs=4, cpu_kv_gib=0.01)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        with torch.no_grad():
            want = oracle.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=8, do_sample=False, pad_token_id=0,
            )[0, len(prompt):].tolist()  # fmt: skip
        assert list(result.choices[0].token_ids) == want
    ids = torch.tensor([prompts[2]])
    with torch.no_grad():
        fp8_logits, plain_logits = oracle(ids).logits[0, -1], hf(ids).logits[0, -1]
    ours = llm.engine.model  # the last position's logits through the engine's own model
    from tests.model_fixtures import PagedRunner

    runner = PagedRunner(llm.engine.loaded, page_size=16)
    got = runner.step([(0, 0, prompts[2])])[0]
    assert ours is runner.loaded.model
    err_fp8 = (got - fp8_logits).norm() / fp8_logits.norm()
    err_plain = (got - plain_logits).norm() / plain_logits.norm()
    assert err_fp8 < 1e-4 and err_plain > 10 * err_fp8, (err_fp8, err_plain)
