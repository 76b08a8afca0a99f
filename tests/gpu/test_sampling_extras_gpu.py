"""Penalties and logprobs on the device path (CUDA, CUDA graphs, overlap) against the torch
path on CPU and against transformers.

Penalties and logprobs run after the captured decode graph (worker.engine.graph), on the
logits it returns, so switching graphs or overlap changes no arithmetic: those comparisons
demand identical tokens and logprobs. CUDA against CPU on the same fp32 inputs allows float
rounding only.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.model_fixtures import tiny_hf_model  # noqa: E402

pytestmark = pytest.mark.gpu
VOCAB = 151936
EOS = (5, 7)


def _penalty_batch(device: str):
    from wire.schema import SamplingParams
    from worker.engine.penalties import build_penalties, penalty_row

    gen = torch.Generator().manual_seed(0)
    params = [
        SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25, min_tokens=9),
        SamplingParams(),
        SamplingParams(logit_bias={str(i * 997): (-1) ** i * 3.0 for i in range(100)}, temperature=0.0),
        SamplingParams(repetition_penalty=0.8, stop_token_ids=[11], min_tokens=4, seed=3),
    ]
    pool = torch.randint(0, VOCAB, (5, 512), generator=gen, dtype=torch.int32)
    lens, prompt_lens = [500, 20, 7, 300], [200, 10, 7, 297]
    rows = [penalty_row(p, EOS, VOCAB) for p in params]
    penalties = build_penalties(rows, [3, 0, 1, 2], prompt_lens, lens, pool.to(device))
    logits = torch.randn(len(params), VOCAB, generator=gen) * 4
    return params, penalties, logits.to(device)


def test_penalties_on_cuda_match_cpu():
    from worker.engine.penalties import apply_penalties

    _, on_cpu, logits = _penalty_batch("cpu")
    _, on_cuda, _ = _penalty_batch("cuda")
    expected = apply_penalties(logits, on_cpu)
    got = apply_penalties(logits.cuda(), on_cuda).cpu()
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_penalised_sampling_and_logprobs_on_cuda_match_cpu():
    """Tokens (greedy and seeded, through the fused kernel where it applies) and the packed
    logprob copy: CUDA against CPU."""
    from worker.engine.logprobs import logprob_rows, pack_with_tokens, raw_logprobs, unpack
    from worker.engine.sampler import Sampler
    from worker.scheduler.prepare import sampling_tensors

    results = []
    for device in ("cpu", "cuda"):
        params, penalties, logits = _penalty_batch(device)
        wanted = logprob_rows([5, None, 20, 0], torch.device(device))
        tensors = replace(
            sampling_tensors(params, [0, 1, 2, 3], device, seeds=[1, 2, 3, 4]),
            penalties=penalties,
            logprobs=wanted,
        )
        raw = raw_logprobs(logits, wanted)
        tokens = Sampler().sample(logits, tensors)
        packed = pack_with_tokens(tokens, raw, wanted).cpu()
        results.append(unpack(packed, len(params), wanted))
    (cpu_tokens, cpu_lp), (cuda_tokens, cuda_lp) = results
    assert cuda_tokens.tolist() == cpu_tokens.tolist()
    assert cpu_lp is not None and cuda_lp is not None
    torch.testing.assert_close(cuda_lp.sampled, cpu_lp.sampled, rtol=0, atol=1e-4)
    torch.testing.assert_close(cuda_lp.top_values, cpu_lp.top_values, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    model = tiny_hf_model(
        "qwen3",
        spread=0.05,
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        head_dim=128,
        max_position_embeddings=1024,
    )
    path = tmp_path_factory.mktemp("qwen3-extras")
    model.save_pretrained(path)
    return model.float().eval(), path


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(0, 500, (n,), generator=gen).tolist() for n in (5, 40, 17, 90, 3, 64)]


def _params():
    from wire.schema import SamplingParams

    common = dict(max_tokens=12, ignore_eos=True)
    return [
        SamplingParams(**common, temperature=0.0, repetition_penalty=1.4, logprobs=True, top_logprobs=5),
        SamplingParams(**common, temperature=0.0),
        SamplingParams(**common, temperature=0.8, seed=7, frequency_penalty=0.7, logprobs=True),
        SamplingParams(**common, temperature=0.0, logit_bias={"9": 4.0}, presence_penalty=1.0),
        SamplingParams(**common, temperature=0.0, logprobs=True, top_logprobs=20),
        SamplingParams(**common, temperature=1.0, seed=2, min_tokens=12, stop_token_ids=[1, 2, 3]),
    ]


def _run(path, **options):
    from worker import LLM

    llm = LLM(str(path), max_running_reqs=16, num_pages=4096, max_seq_len=512, **options)
    results = llm.generate(_prompts(), _params())
    assert all(r.error is None for r in results), [r.error for r in results]
    out = [
        (
            c.token_ids,
            [(e.logprob, [(t.token_id, t.logprob) for t in e.top_logprobs]) for e in c.logprobs or []],
        )
        for r in results
        for c in r.choices
    ]
    del llm
    torch.cuda.empty_cache()
    return out


def test_graphs_and_overlap_change_no_token_or_logprob(tiny_dir):
    _, path = tiny_dir
    fast = _run(path, dtype="bfloat16")  # flashinfer, CUDA graphs, overlap
    assert _run(path, dtype="bfloat16", cuda_graph=False) == fast
    assert _run(path, dtype="bfloat16", overlap=False) == fast


def test_cuda_fp32_matches_the_cpu_torch_path(tiny_dir):
    """The same fp32 engine on CUDA (torch attention) and on CPU: same greedy tokens under
    penalties, logprobs within 1e-3."""
    _, path = tiny_dir
    on_cuda = _run(path, dtype="float32", attention="torch", cuda_graph=False)
    on_cpu = _run(path, dtype="float32", attention="torch", device="cpu")
    for (tokens_gpu, lp_gpu), (tokens_cpu, lp_cpu), sp in zip(on_cuda, on_cpu, _params(), strict=True):
        if sp.greedy:
            assert tokens_gpu == tokens_cpu
        if tokens_gpu == tokens_cpu:
            for (a, top_a), (b, top_b) in zip(lp_gpu, lp_cpu, strict=True):
                assert abs(a - b) < 1e-3
                assert all(abs(x[1] - y[1]) < 1e-3 for x, y in zip(top_a, top_b, strict=True))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_complete_grammar_wins_over_min_tokens_on_cuda(temperature: float) -> None:
    """The sampler's rule for a row that the grammar's mask and min_tokens leave without a
    token (worker.engine.sampler): on CUDA (the fused unfiltered kernel included at
    temperature 1) as on CPU, the grammar's EOS is drawn; a row with another allowed token
    draws it; an unconstrained row never draws EOS while min_tokens holds."""
    from wire.schema import SamplingParams
    from worker.engine.penalties import build_penalties, penalty_row
    from worker.engine.sampler import Sampler
    from worker.scheduler.prepare import sampling_tensors

    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, VOCAB, generator=gen)
    bitmask = torch.full((3, -(-VOCAB // 32)), -1, dtype=torch.int32)
    bitmask[:2] = 0
    bitmask[:2, 0] = 1 << EOS[0]
    bitmask[1, 1] |= 1 << 8  # token 40
    params = SamplingParams(temperature=temperature, min_tokens=5, seed=0)
    drawn = []
    for device in ("cpu", "cuda"):
        pool = torch.zeros(3, 16, dtype=torch.int32, device=device)
        penalties = build_penalties([penalty_row(params, EOS, VOCAB)] * 3, [0, 1, 2], [4] * 3, [5] * 3, pool)
        tensors = replace(
            sampling_tensors([params] * 3, [1] * 3, device, seeds=[0, 1, 2]), penalties=penalties
        )
        tokens = Sampler().sample(logits.to(device), tensors, bitmask.to(device)).tolist()
        assert tokens[:2] == [EOS[0], 40] and tokens[2] not in EOS
        drawn.append(tokens)
    assert drawn[0] == drawn[1]
