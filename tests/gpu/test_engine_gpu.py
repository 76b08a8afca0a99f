"""The whole GPU fast path (FlashInfer, fused kernels, CUDA graphs, overlap) against transformers.

Tiny random Qwen3 and Llama models (head_dim 128, bf16, as the FlashInfer JIT cache holds)
are saved with save_pretrained and loaded by radixq from disk. Oracle: transformers' greedy
decoding in float32 on the same weights. bf16 rounding may flip a near-tie, so where the
token streams first differ the test asks the oracle that both tokens were within a bf16-sized
logit margin there, and stops comparing that prompt. Switching overlap or CUDA graphs changes
no arithmetic (same batches, same kernels), so those comparisons demand identical tokens.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.model_fixtures import tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.gpu
MARGIN = 0.15  # logit gap below which bf16 rounding may flip the argmax of these tiny models


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    lengths = [5, 17, 33, 64, 9, 120, 2, 48, 77, 30]
    return [torch.randint(0, 500, (n,), generator=gen).tolist() for n in lengths]


MAX_TOKENS = [12, 5, 16, 9, 16, 3, 14, 16, 7, 11]  # decode batches shrink: padding gets exercised


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def tiny_dir(request, tmp_path_factory):
    model = tiny_hf_model(
        request.param,
        spread=0.05,
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        head_dim=128,
        max_position_embeddings=1024,
    )
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return model.to(torch.bfloat16).float().cuda(), path  # the oracle sees the bf16-rounded weights


def _generate(path, **options) -> list[list[int]]:
    from wire.schema import SamplingParams
    from worker import LLM

    llm = LLM(str(path), dtype="bfloat16", max_running_reqs=16, num_pages=8192, max_seq_len=512, **options)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    results = llm.generate(_prompts(), params)
    assert all(r.error is None for r in results), [r.error for r in results]
    tokens = [r.choices[0].token_ids for r in results]
    del llm
    torch.cuda.empty_cache()
    return tokens


def _assert_matches_oracle(hf, prompt: list[int], got: list[int], n: int) -> None:
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]).cuda(), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    expected = ref[0, len(prompt) :].tolist()
    assert len(got) == n
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if a != b:
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + expected[:i]]).cuda()).logits[0, -1]
            gap = float(logits[b] - logits[a])
            assert gap < MARGIN, f"token {i}: radixq {a}, transformers {b}, logit gap {gap:.3f}"
            return


def test_fast_path_matches_transformers(tiny_dir):
    hf, path = tiny_dir
    got = _generate(path)  # defaults on CUDA: flashinfer, CUDA graphs, overlap
    for prompt, tokens, n in zip(_prompts(), got, MAX_TOKENS, strict=True):
        _assert_matches_oracle(hf, prompt, tokens, n)


def test_mixed_prefill_decode_steps_match_transformers(tiny_dir):
    """A 40-token prefill budget admits the prompts over several steps, chunking the long
    ones, while earlier ones decode: those steps mix prefill and decode rows (FlashInfer's
    prefill path, no graph); pure decode steps replay graphs. Tokens still match the oracle."""
    hf, path = tiny_dir
    got = _generate(path, max_prefill_tokens=40)
    for prompt, tokens, n in zip(_prompts(), got, MAX_TOKENS, strict=True):
        _assert_matches_oracle(hf, prompt, tokens, n)
    assert _generate(path, max_prefill_tokens=40, overlap=False) == got


def test_overlap_and_graphs_change_no_token(tiny_dir):
    _, path = tiny_dir
    fast = _generate(path)
    assert _generate(path, overlap=False) == fast
    assert _generate(path, cuda_graph=False) == fast
    assert _generate(path, cuda_graph=False, overlap=False) == fast


def test_fused_kernels_match_torch_on_cuda():
    from worker.kernels import ops
    from worker.models.rope import RotaryEmbedding

    assert ops._triton() is not None, "triton kernels should be active on CUDA"
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 1024, device="cuda", generator=gen).bfloat16()
    res = torch.randn(300, 1024, device="cuda", generator=gen).bfloat16()
    w = (1 + 0.1 * torch.randn(1024, device="cuda", generator=gen)).bfloat16()
    tol = dict(atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), ops.rms_norm_ref(x, w, 1e-6), **tol)
    out, total = ops.add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(total, res + x)
    torch.testing.assert_close(out, ops.rms_norm_ref(res + x, w, 1e-6), **tol)
    rope = RotaryEmbedding(128, 4096, 1e6, None, "cuda")
    qkv = torch.randn(300, 32 * 128, device="cuda", generator=gen).bfloat16()
    q = qkv[:, : 16 * 128].view(300, 16, 128)
    pos = torch.randint(0, 4096, (300,), device="cuda", generator=gen)
    qw = (1 + 0.1 * torch.randn(128, device="cuda", generator=gen)).bfloat16()
    torch.testing.assert_close(
        ops.norm_rope(q, pos, rope.cos_cache, rope.sin_cache, qw, 1e-6),
        rope.apply(pos, ops.rms_norm_ref(q, qw, 1e-6)),
        **tol,
    )
    gate_up = torch.randn(300, 2 * 3072, device="cuda", generator=gen).bfloat16()
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up, **tol)


def test_fused_sampler_draws_what_the_torch_sampler_draws():
    """Temperature-only rows: the CUDA kernel against the torch inverse-CDF path on CPU."""
    from wire.schema import SamplingParams
    from worker.engine.sampler import Sampler
    from worker.scheduler.prepare import sampling_tensors

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 151936, generator=gen) * 3
    params = [
        SamplingParams(
            temperature=0.0 if i % 7 == 0 else 0.2 + 0.02 * i,
            seed=(i * 0x9E3779B97F4A7C15) % 2**63,  # both 32-bit halves of the seed matter
        )
        for i in range(64)
    ]
    steps = list(range(64))
    expected = Sampler().sample(logits, sampling_tensors(params, steps, "cpu"))
    got = Sampler().sample(logits.cuda(), sampling_tensors(params, steps, "cuda"))
    assert got.dtype == torch.int32
    assert got.cpu().tolist() == expected.tolist()


def test_fused_fp8_store_matches_kv_pool_store_on_cuda():
    """The fused qk-norm/rope/store kernel writes FP8 pages bit for bit as KVPool.store does, and
    hands back the rotated keys as computed (new_k: what the FP8 prefill attends)."""
    from worker.kernels import ops
    from worker.kvcache.pool import KVPool
    from worker.models.rope import RotaryEmbedding

    gen = torch.Generator(device="cuda").manual_seed(1)
    hq, hkv, d, t = 16, 8, 128, 300
    rope = RotaryEmbedding(d, 4096, 1e6, None, "cuda")
    qkv = (4 * torch.randn(t, (hq + 2 * hkv) * d, device="cuda", generator=gen)).bfloat16()
    pos = torch.randint(0, 4096, (t,), device="cuda", generator=gen)
    out_loc = torch.randperm(t + 20, device="cuda", generator=gen)[:t]
    fused, ref = (
        KVPool(1, 20, 16, hkv, d, torch.bfloat16, "cuda", cache_dtype=torch.float8_e4m3fn) for _ in range(2)
    )
    for pool in (fused, ref):
        pool.set_scales([0.01], [0.004])
    cos, sin = rope.cos_cache, rope.sin_cache
    args = (None, None, 1e-6, fused.k_buffer(0), fused.v_buffer(0), out_loc, hq, hkv, 0.01, 0.004)
    new_k = torch.full((t, hkv, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    q = ops.qk_norm_rope_store(qkv, pos, cos, sin, *args, new_k=new_k)
    assert q is not None, "the fused kernel should take FP8 pages on CUDA"
    _, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    k = ops.norm_rope(k.reshape(t, hkv, d), pos, cos, sin, None, 1e-6)
    torch.testing.assert_close(new_k, k)
    ref.store(0, out_loc, k, v.reshape(t, hkv, d))
    assert torch.equal(fused.k_buffer(0).float(), ref.k_buffer(0).float())
    assert torch.equal(fused.v_buffer(0).float(), ref.v_buffer(0).float())


def test_abort_mid_decode_under_graphs_and_overlap_frees_everything(tiny_dir):
    """`radixq cancel` reaches the engine as AbortRequest: requests aborted while they decode
    (CUDA graphs, overlap) or wait end ``aborted`` with no tokens, every page comes back, and
    the others still match the oracle."""
    from wire.schema import SamplingParams
    from worker.scheduler import InMemoryIO, build_scheduler
    from worker.scheduler.config import SchedulerProcessConfig
    from worker.scheduler.messages import AbortRequest, GenerateRequest

    hf, path = tiny_dir
    config = SchedulerProcessConfig.from_options(
        str(path), device="cuda", dtype="bfloat16", max_running_reqs=4, num_pages=8192, max_seq_len=512
    )
    io = InMemoryIO()
    scheduler = build_scheduler(config, io)
    long = [n + 24 for n in MAX_TOKENS]  # still decoding after the first steps
    for i, (prompt, n) in enumerate(zip(_prompts(), long, strict=True)):
        io.put(
            GenerateRequest(
                uid=f"r{i}",
                input_ids=prompt,
                sampling=SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
            )
        )
    last = None
    for _ in range(12):  # 4 running (decoding by now), 6 waiting
        last = scheduler.step(last, block=False)
    aborted = {"r0", "r1", "r9"}  # admitted first (decoding), and the last (waiting)
    for uid in aborted:
        io.put(AbortRequest(uid=uid))
    for _ in range(2000):
        last = scheduler.step(last, block=False)
        if last is None and scheduler.idle:
            break
    assert scheduler.idle
    scheduler.check_integrity(None)
    assert scheduler.cache.num_private_pages == 0
    finished = {m.uid: m for m in io.take_all()}
    assert set(finished) == {f"r{i}" for i in range(10)}
    for i, (prompt, n) in enumerate(zip(_prompts(), long, strict=True)):
        message = finished[f"r{i}"]
        if f"r{i}" in aborted:
            assert message.error_code == "aborted" and message.choices == []
        else:
            assert message.error_code is None
            _assert_matches_oracle(hf, prompt, message.choices[0].token_ids, n)
