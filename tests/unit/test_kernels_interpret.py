"""worker.kernels: the Triton kernels (run by triton's CPU interpreter) against the torch paths."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

from tests.triton_interpret import interpreted_test_module

interpreted_test_module(
    "worker.kernels.triton_kernels",
    "worker.kernels.sampling_triton",
    native_tests="tests/gpu/test_engine_gpu.py",
)


@pytest.fixture(scope="module")
def ops():
    """worker.kernels.ops with its kernels run by triton's interpreter on CPU tensors."""
    module = importlib.import_module("worker.kernels.ops")
    os.environ["TRITON_INTERPRET"] = "1"
    with module.triton_scope(True):
        yield module
    os.environ.pop("TRITON_INTERPRET", None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_residual(ops, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=gen).to(dtype)
    res = torch.randn(5, 48, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(48, generator=gen)).to(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), ops.rms_norm_ref(x, w, 1e-6), **tol)
    out, total = ops.add_rms_norm(x, res, w, 1e-6)
    torch.testing.assert_close(total, res + x, **tol)
    torch.testing.assert_close(out, ops.rms_norm_ref(res + x, w, 1e-6), **tol)


@pytest.mark.parametrize("with_norm", [False, True])
def test_norm_rope_on_strided_heads(ops, with_norm):
    from worker.models.rope import RotaryEmbedding

    gen = torch.Generator().manual_seed(1)
    rope = RotaryEmbedding(16, 64, 10000.0, None, "cpu")
    qkv = torch.randn(6, 3 * 2 * 16 + 7, generator=gen)  # a strided q slice, as after qkv_proj
    q = qkv[:, : 2 * 16].view(6, 2, 16)
    pos = torch.tensor([0, 3, 9, 17, 33, 63])
    w = 1 + 0.1 * torch.randn(16, generator=gen) if with_norm else None
    got = ops.norm_rope(q, pos, rope.cos_cache, rope.sin_cache, w, 1e-6)
    normed = q if w is None else ops.rms_norm_ref(q, w, 1e-6)
    torch.testing.assert_close(got, rope.apply(pos, normed), atol=1e-5, rtol=1e-5)


def test_silu_and_mul(ops):
    x = torch.randn(4, 2 * 40, generator=torch.Generator().manual_seed(2))
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_and_mul(x), torch.nn.functional.silu(gate) * up)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_and_mul(ops, dtype):
    """GeGLU (Gemma): torch's gelu(approximate="tanh") of the gate, rounded to the dtype, times up."""
    x = (3 * torch.randn(4, 2 * 40, generator=torch.Generator().manual_seed(2))).to(dtype)
    gate, up = x.chunk(2, dim=-1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    want = torch.nn.functional.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(ops.act_and_mul(x, "gelu_pytorch_tanh"), want, **tol)


@pytest.mark.parametrize("two_pass", [False, True], ids=["one-pass", "two-pass"])
@pytest.mark.parametrize("chunk", [8192, 512], ids=["chunks-8192", "chunks-512"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_sampling_draws_what_the_torch_sampler_draws(ops, dtype, chunk, two_pass, monkeypatch):
    """Rows summarised in chunks (2 or 18 a row), some masked out to -inf as a grammar masks
    them (whole chunks, and all but a few tokens), greedy rows whose max is tied across chunks;
    the chunk summaries in one pass (a row's mass rescaled as its max rises within a chunk of
    8,192) and in the two-pass schedule the benchmark times against."""
    from wire.schema import SamplingParams
    from worker.engine.sampler import Sampler
    from worker.kernels import sampling
    from worker.kernels.sampling import sample_unfiltered
    from worker.scheduler.prepare import sampling_tensors

    monkeypatch.setattr(sampling, "_CHUNK", chunk)
    monkeypatch.setattr(sampling, "_BLOCK", min(chunk, 2048))
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(24, 9000, generator=gen) * 4
    logits[1, :6000] = float("-inf")  # whole chunks masked
    logits[2, :] = float("-inf")
    logits[2, [17, 4100, 8999]] = torch.tensor([0.5, 1.0, 0.7])  # three tokens allowed
    logits[5, [100, 7000]] = 50.0  # greedy (row 5): a tie across chunks, the first wins
    logits = logits.to(dtype)  # the model's dtype
    params = [
        SamplingParams(
            temperature=0.0 if i % 5 == 0 else 0.3 + 0.1 * i,
            seed=(i * 0x9E3779B97F4A7C15) % 2**63,  # both 32-bit halves of the seed matter
        )
        for i in range(24)
    ]
    t = sampling_tensors(params, [1000 + 37 * i for i in range(24)], "cpu")
    expected = Sampler().sample(logits, t)
    got = sample_unfiltered(logits, t.temperature, t.seeds, t.steps, t.greedy, two_pass=two_pass)
    assert got is not None and got.dtype == torch.int32
    assert got.tolist() == expected.tolist()


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("with_norm", [False, True])
def test_qk_norm_rope_store_matches_the_unfused_path(ops, with_norm, page_size):
    from worker.kvcache.pool import KVPool
    from worker.models.rope import RotaryEmbedding

    gen = torch.Generator().manual_seed(6)
    hq, hkv, d, t = 4, 2, 16, 5
    rope = RotaryEmbedding(d, 64, 10000.0, None, "cpu")
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
    pos = torch.tensor([0, 5, 9, 33, 63])
    out_loc = torch.tensor([7, 2, 11, 0, 5])
    q_w = 1 + 0.1 * torch.randn(d, generator=gen) if with_norm else None
    k_w = 1 + 0.1 * torch.randn(d, generator=gen) if with_norm else None
    fused, ref = (KVPool(1, 12 // page_size, page_size, hkv, d, torch.float32, "cpu") for _ in range(2))
    new_k = torch.full((t, hkv, d), float("nan"))
    q = ops.qk_norm_rope_store(
        qkv,
        pos,
        rope.cos_cache,
        rope.sin_cache,
        q_w,
        k_w,
        1e-6,
        fused.k_buffer(0),
        fused.v_buffer(0),
        out_loc,
        hq,
        hkv,
        new_k=new_k,
    )
    q_ref, k_ref, v_ref = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q_ref = ops.norm_rope(q_ref.view(t, hq, d), pos, rope.cos_cache, rope.sin_cache, q_w, 1e-6)
    k_ref = ops.norm_rope(k_ref.view(t, hkv, d), pos, rope.cos_cache, rope.sin_cache, k_w, 1e-6)
    ref.store(0, out_loc, k_ref, v_ref.view(t, hkv, d))
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(new_k, k_ref)  # the pass's own keys, handed back as computed
    torch.testing.assert_close(fused.k_buffer(0), ref.k_buffer(0))
    torch.testing.assert_close(fused.v_buffer(0), ref.v_buffer(0))
    # the pool's own by-location view agrees with the unfused values
    k_at, v_at = fused.gather(0, out_loc)
    torch.testing.assert_close(k_at, k_ref)
    torch.testing.assert_close(v_at, v_ref.view(t, hkv, d))


def test_qk_norm_rope_store_into_fp8_pages(ops):
    """The fused store into an FP8 pool scales, saturates and rounds as KVPool.store does."""
    from worker.kvcache.pool import KVPool
    from worker.models.rope import RotaryEmbedding

    gen = torch.Generator().manual_seed(7)
    hq, hkv, d, t = 4, 2, 16, 6
    rope = RotaryEmbedding(d, 64, 10000.0, None, "cpu")
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen) * 3
    qkv[0, hq * d] = 1e4  # a key past the FP8 range at this scale: saturates, not NaN
    pos, out_loc = torch.tensor([0, 5, 9, 33, 63, 2]), torch.tensor([7, 2, 11, 0, 5, 3])
    fused, ref = (
        KVPool(1, 3, 4, hkv, d, torch.float32, "cpu", cache_dtype=torch.float8_e4m3fn) for _ in range(2)
    )
    for pool in (fused, ref):
        pool.set_scales([0.02], [0.005])
    cos, sin = rope.cos_cache, rope.sin_cache
    args = (None, None, 1e-6, fused.k_buffer(0), fused.v_buffer(0), out_loc, hq, hkv, 0.02, 0.005)
    new_k = torch.full((t, hkv, d), float("nan"))
    q = ops.qk_norm_rope_store(qkv, pos, cos, sin, *args, new_k=new_k)
    q_ref, k_ref, v_ref = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q_ref = ops.norm_rope(q_ref.view(t, hq, d), pos, cos, sin, None, 1e-6)
    k_ref = ops.norm_rope(k_ref.view(t, hkv, d), pos, cos, sin, None, 1e-6)
    ref.store(0, out_loc, k_ref, v_ref.view(t, hkv, d))
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(new_k, k_ref)  # as computed: not scaled, rounded or saturated
    for got, want in ((fused.k_buffer(0), ref.k_buffer(0)), (fused.v_buffer(0), ref.v_buffer(0))):
        assert got.dtype == torch.float8_e4m3fn
        got, want = got.float(), want.float()
        # NOTE: triton 3.x's CPU interpreter converts values that round up to +-128 into +-64
        # (no carry into the exponent); the GPU converts them right, which
        # tests/gpu/test_engine_gpu.py checks bit for bit. Everything else must be equal.
        interpreter_slip = (want.abs() == 128) & (got == want / 2)
        assert torch.equal(got[~interpreter_slip], want[~interpreter_slip])
        assert interpreter_slip.sum() <= 4
    assert fused.k_buffer(0).float().abs().max() == 448.0


def _same_e4m3_but_interpreter_carries(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal e4m3 values, except where triton's interpreter mis-rounds (the GPU's cvt does not):
    it drops the carry when rounding up crosses a power of two (31.05 becomes 16, not 32), and
    rounds subnormals (up to 2^-6) to a neighbouring step of 2^-9."""
    g, w = got.float(), want.float()
    off = g != w
    carried = (w.abs() == 2.0 ** torch.log2(w.abs()).round()) & (g.abs() == w.abs() / 2)
    subnormal = (w.abs() <= 2.0**-6) & ((g - w).abs() <= 2.0**-9)
    allowed = carried | subnormal
    assert bool((~off | allowed).all()), (g[off & ~allowed][:8], w[off & ~allowed][:8])
    assert off.float().mean() < 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_quantizing_kernels(ops, dtype):
    """The fused norm / SiLU-mul kernels with fp8=True and the row quantizer against
    quantize_fp8_rows_ref of the torch paths' values (scales to rounding)."""
    gen = torch.Generator().manual_seed(6)
    x = (3 * torch.randn(6, 96, generator=gen)).to(dtype)
    res = torch.randn(6, 96, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype)
    gate_up = torch.randn(5, 2 * 700, generator=gen).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    wide = torch.randn(3, 4100, generator=gen).to(dtype)  # past one block: two passes a row
    cases = [
        (ops.quantize_fp8_rows(gate_up), ops.quantize_fp8_rows_ref(gate_up)),  # 2 rows a program, one masked
        (ops.quantize_fp8_rows(wide), ops.quantize_fp8_rows_ref(wide)),
        (ops.rms_norm(x, w, 1e-6, fp8=True), ops.quantize_fp8_rows_ref(ops.rms_norm_ref(x, w, 1e-6))),
        (ops.add_rms_norm(x, res, w, 1e-6, fp8=True)[0], ops.quantize_fp8_rows_ref(ops.rms_norm_ref(res + x, w, 1e-6))),
        (ops.silu_and_mul(gate_up, fp8=True), ops.quantize_fp8_rows_ref(torch.nn.functional.silu(gate) * up)),
        (
            ops.act_and_mul(gate_up, "gelu_pytorch_tanh", fp8=True),
            ops.quantize_fp8_rows_ref(torch.nn.functional.gelu(gate, approximate="tanh") * up),
        ),
    ]  # fmt: skip
    for got, want in cases:
        assert got.data.dtype == torch.float8_e4m3fn
        torch.testing.assert_close(got.scale, want.scale, rtol=2e-2, atol=0)
        if dtype == torch.float32:  # bf16 inputs: the interpreter's own bf16 rounding differs too
            _same_e4m3_but_interpreter_carries(got.data, want.data)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_fused_path_hands_its_new_kv_to_a_backend_that_asks(ops, kind, tmp_path, monkeypatch):
    """The decoder through qk_norm_rope_store (new_k written by the kernel, v read in place from
    qkv) hands a backend that wants them the K/V the pool stored."""
    import worker.models.layers as layers
    from tests.model_fixtures import check_new_kv_handed_over, tiny_hf_model
    from worker.models.loader import load_model

    tiny_hf_model(kind, spread=0.05, vocab_size=128).save_pretrained(tmp_path)
    fused_with_new_k = []
    original = ops.qk_norm_rope_store

    def spy(*args):
        q = original(*args)
        fused_with_new_k.append(q is not None and args[-1] is not None)
        return q

    monkeypatch.setattr(layers, "qk_norm_rope_store", spy)
    check_new_kv_handed_over(load_model(str(tmp_path)))
    assert any(fused_with_new_k), "the fused kernel did not run with new_k"
