"""Sampler properties, checked against torch's own softmax/argmax and independent filters."""

from __future__ import annotations

import pytest
import torch

from wire.schema import MAX_TOP_K, SamplingParams
from worker.engine.sampler import Sampler, row_uniforms
from worker.scheduler.prepare import sampling_tensors

VOCAB = 64


def _sample(logits: torch.Tensor, params: list[SamplingParams], steps: list[int]) -> torch.Tensor:
    return Sampler().sample(logits, sampling_tensors(params, steps, logits.device))


def test_greedy_is_argmax():
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=1, temperature=1.3)] * 3
    out = _sample(logits, params, [0] * 6)
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), logits.argmax(-1))


def test_mixed_greedy_and_sampled_rows():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(seed=1),
        SamplingParams(temperature=0.0),
        SamplingParams(seed=2),
    ]
    out = _sample(logits, params, [0, 0, 0, 0])
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_seeded_sampling_ignores_batch_composition():
    """A seeded request draws the same tokens across runs, batch sizes and row positions."""
    gen = torch.Generator().manual_seed(2)
    target_logits = torch.randn(VOCAB, generator=gen)
    target = SamplingParams(temperature=1.5, top_p=0.9, seed=1234)
    alone = [int(_sample(target_logits[None], [target], [step])[0]) for step in range(20)]
    assert len(set(alone)) > 1, "different steps must draw different noise"
    for position, batch_size in [(0, 3), (2, 3), (5, 8)]:
        for step in range(20):
            logits = torch.randn(batch_size, VOCAB, generator=gen)
            logits[position] = target_logits
            params = [SamplingParams(temperature=0.7, top_k=5, seed=i) for i in range(batch_size)]
            params[position] = target
            steps = [step + 3 * i for i in range(batch_size)]
            steps[position] = step
            assert int(_sample(logits, params, steps)[position]) == alone[step]


def test_seeds_differ_and_unseeded_requests_vary():
    logits = torch.zeros(1, VOCAB)
    by_seed = {int(_sample(logits, [SamplingParams(seed=s)], [0])[0]) for s in range(40)}
    unseeded = {int(_sample(logits, [SamplingParams()], [0])[0]) for _ in range(40)}
    assert len(by_seed) > 20 and len(unseeded) > 20


def test_row_uniforms_are_uniform_and_keyed():
    """Uniforms over many (seed, step) keys fill (0, 1) evenly; neighbouring keys differ."""
    seeds = torch.arange(50_000, dtype=torch.int64) * 7919 + 2**62
    for steps in (torch.zeros(50_000, dtype=torch.int64), torch.arange(50_000, dtype=torch.int64)):
        u = row_uniforms(seeds, steps)
        assert u.dtype == torch.float64 and bool((u > 0).all()) and bool((u < 1).all())
        counts = torch.histc(u.float(), bins=10, min=0, max=1)
        assert bool(((counts - 5_000).abs() < 400).all()), counts
    same_seed = row_uniforms(torch.full((1000,), 5), torch.arange(1000))
    assert len(set(same_seed.tolist())) == 1000


def _draws(logits: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    """n independent draws for one distribution: one batch of n rows with distinct seeds."""
    batch = [SamplingParams(**{**_fields(params), "seed": i}) for i in range(n)]
    return _sample(logits.expand(n, -1).contiguous(), batch, [0] * n).long()


def _fields(params: SamplingParams) -> dict:
    return {f: getattr(params, f) for f in params.__struct_fields__}


def test_temperature_matches_softmax():
    """Draw frequencies follow softmax(logits / T) (loose chi-square bound)."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 20_000
    for temperature in (0.5, 1.0, 2.0):
        counts = torch.bincount(
            _draws(logits, SamplingParams(temperature=temperature), n), minlength=6
        ).double()
        expected = torch.softmax(logits.double() / temperature, 0) * n
        chi2 = float(((counts - expected) ** 2 / expected.clamp_min(1e-9)).sum())
        assert chi2 < 30, (temperature, counts, expected)  # 5 dof: p ~ 1e-5


def _allowed(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    """Independent statement of the filter rules: k best, then nucleus, then min-p."""
    probs = torch.softmax(logits.double(), 0)
    order = sorted(range(len(probs)), key=lambda i: -float(probs[i]))
    kept = order[:top_k] if top_k > 0 else order
    mass = sum(float(probs[i]) for i in kept)
    nucleus, cumulative = [], 0.0
    for i in kept:
        if cumulative >= top_p * mass and top_p < 1:
            break
        nucleus.append(i)
        cumulative += float(probs[i])
    best = float(probs[nucleus[0]])
    return {i for i in nucleus if float(probs[i]) >= min_p * best}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.6),
        SamplingParams(min_p=0.2),
        SamplingParams(top_k=10, top_p=0.8, min_p=0.05, temperature=1.3),
    ],
)
def test_filters_never_emit_excluded_tokens(params):
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3)) * 2
    scaled = logits / params.temperature
    allowed = _allowed(scaled, params.top_k, params.top_p, params.min_p)
    assert 1 < len(allowed) < VOCAB
    seen = set(_draws(logits, params, 8_000).tolist())
    assert seen <= allowed
    assert len(seen) >= len(allowed) // 2


def test_sampling_tensors_reject_misaligned_inputs():
    with pytest.raises(ValueError, match="must align"):
        sampling_tensors([SamplingParams()], [0, 1], "cpu")


def test_bf16_logits_sample_as_their_float32_upcast():
    """Model-dtype logits: greedy, filtered and plain draws equal those of the exact fp32 upcast."""
    logits = (torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(5)) * 3).bfloat16()
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(seed=1, temperature=0.8),
        SamplingParams(seed=2, top_k=5),
        SamplingParams(seed=3, top_p=0.8),
        SamplingParams(seed=4, min_p=0.05),
        SamplingParams(temperature=0.0),
    ]
    for rows in (range(6), [1], [0, 5]):  # all rows, temperature only, all greedy
        subset, steps = [params[r] for r in rows], list(rows)
        got = _sample(logits[list(rows)], subset, steps)
        assert torch.equal(got, _sample(logits[list(rows)].float(), subset, steps))


def test_temperatures_below_epsilon_are_greedy_rows():
    """One greedy rule (SamplingParams.greedy): 1e-45 would overflow logits / T in float32."""
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(6)) * 5
    params = [SamplingParams(temperature=t, seed=i) for i, t in enumerate((1e-45, 9.9e-6, 0.0))]
    tensors = sampling_tensors(params, [0, 0, 0], "cpu")
    assert tensors.all_greedy and tensors.temperature.tolist() == [1.0, 1.0, 1.0]
    assert torch.equal(Sampler().sample(logits, tensors).long(), logits.argmax(-1))


def test_top_k_covering_the_vocabulary_is_off():
    """top_k >= vocab is built as off, so it draws exactly what top_k off draws; unclamped
    (no vocab size given) the filter runs with the largest top_k and keeps every token."""
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(7))
    for top_k in (VOCAB, VOCAB + 1, MAX_TOP_K):
        for step in range(10):
            params = [SamplingParams(top_k=top_k, seed=1)]
            tensors = sampling_tensors(params, [step], "cpu", vocab_size=VOCAB)
            assert not tensors.use_top_k and tensors.top_k.tolist() == [0]
            off = _sample(logits, [SamplingParams(seed=1)], [step])
            assert torch.equal(Sampler().sample(logits, tensors), off)
    unclamped = sampling_tensors(
        [SamplingParams(top_k=MAX_TOP_K, seed=s) for s in range(500)], [0] * 500, "cpu"
    )
    assert unclamped.use_top_k
    assert len(set(Sampler().sample(logits.expand(500, -1), unclamped).tolist())) > VOCAB // 2
