"""Penalties, logit_bias and min_tokens (worker.engine.penalties) against transformers' logits
processors (repetition, sequence bias, min new tokens) and, for frequency/presence, which no
transformers processor implements, a numpy statement of OpenAI's formula written here.

Unit level: random logits and token histories in a token pool, several requests per batch.
End to end: greedy generation of a tiny random Llama equals transformers' ``generate`` with the
same processors, prefix-cache hits and overlap included.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.engine.penalties import apply_penalties, build_penalties, penalty_row
from worker.engine.sampler import Sampler
from worker.llm import LLM
from worker.scheduler.prepare import sampling_tensors

VOCAB = 96
EOS = (5, 7)


def numpy_frequency_presence(
    logits: np.ndarray, output_ids: list[int], frequency: float, presence: float
) -> np.ndarray:
    """OpenAI's documented formula: mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence,
    c[j] the count of token j in the output so far."""
    counts = np.bincount(np.asarray(output_ids, dtype=np.int64), minlength=logits.shape[-1]).astype(
        np.float32
    )
    return logits - counts * np.float32(frequency) - (counts > 0).astype(np.float32) * np.float32(presence)


def reference(
    logits: torch.Tensor, tokens: list[int], prompt_len: int, params: SamplingParams
) -> torch.Tensor:
    """One row through transformers' processors (and the numpy formula), in the documented order."""
    ids = torch.tensor([tokens])
    scores = logits.unsqueeze(0).clone()
    if params.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(ids, scores)
    if params.frequency_penalty or params.presence_penalty:
        out = numpy_frequency_presence(
            scores.numpy(), tokens[prompt_len:], params.frequency_penalty, params.presence_penalty
        )
        scores = torch.from_numpy(out)
    if params.logit_bias:
        bias = [[[int(k)], float(v)] for k, v in params.logit_bias.items()]
        scores = SequenceBiasLogitsProcessor(bias)(ids, scores)
    if params.min_tokens:
        stops = [*params.stop_token_ids, *([] if params.ignore_eos else EOS)]
        scores = MinNewTokensLengthLogitsProcessor(prompt_len, params.min_tokens, stops)(ids, scores)
    return scores[0]


CASES = [
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6),  # below 1 favours repeats
    SamplingParams(),  # no penalty: row left untouched in a penalised batch
    SamplingParams(frequency_penalty=0.8, presence_penalty=-0.5),
    SamplingParams(presence_penalty=2.0),
    SamplingParams(logit_bias={"3": 100.0, "17": -100.0, "40": 2.5}),
    SamplingParams(min_tokens=4, stop_token_ids=[11, 12]),
    SamplingParams(min_tokens=4, ignore_eos=True, stop_token_ids=[13]),
    SamplingParams(
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.25,
        logit_bias={"5": 3.0, "20": -1.0},
        min_tokens=10,
        max_tokens=20,
    ),
]


def _batch(gen: torch.Generator) -> tuple[torch.Tensor, list[list[int]], list[int]]:
    """A token pool of len(CASES) + 1 rows with random histories (ids repeat), their prompt lengths."""
    pool = torch.randint(0, VOCAB, (len(CASES) + 1, 64), generator=gen, dtype=torch.int32)
    lens = torch.randint(8, 64, (len(CASES),), generator=gen).tolist()
    prompt_lens = [int(torch.randint(1, n, (1,), generator=gen)) for n in lens]
    histories = [pool[i, :n].tolist() for i, n in enumerate(lens)]
    return pool, histories, prompt_lens


@pytest.mark.parametrize("seed", range(4))
def test_batch_matches_transformers_processors(seed: int) -> None:
    """Every row of a mixed batch equals its own processors' output; rows sit in shuffled slots
    and the history past each row's length (stale tokens) is ignored."""
    gen = torch.Generator().manual_seed(seed)
    pool, histories, prompt_lens = _batch(gen)
    order = torch.randperm(len(CASES), generator=gen).tolist()  # slot of batch row i
    pool_by_slot = pool.clone()
    pool_by_slot[order] = pool[: len(CASES)]  # row i's tokens move to slot order[i]
    logits = torch.randn(len(CASES), VOCAB, generator=gen) * 4
    logits[:, 3] = -0.0  # a zero logit among the penalised tokens
    rows = [penalty_row(p, EOS, VOCAB) for p in CASES]
    assert rows[2] is None
    penalties = build_penalties(rows, order, prompt_lens, [len(h) for h in histories], pool_by_slot)
    assert penalties is not None
    got = apply_penalties(logits, penalties)
    for i, params in enumerate(CASES):
        expected = reference(logits[i], histories[i], prompt_lens[i], params)
        torch.testing.assert_close(got[i], expected, rtol=0, atol=1e-5, msg=f"case {i}: {params}")
    assert torch.equal(got[2], logits[2])


def test_min_tokens_mask_lifts_at_min_tokens() -> None:
    """The -inf mask holds while fewer than min_tokens were generated, and only then."""
    params = SamplingParams(min_tokens=3, stop_token_ids=[9, 10_000])  # 10_000: outside, dropped
    row = penalty_row(params, EOS, VOCAB)
    assert row is not None and row.stop_tokens == (9, *EOS)
    pool = torch.zeros(2, 32, dtype=torch.int32)
    logits = torch.zeros(1, VOCAB)
    for generated in range(6):
        penalties = build_penalties([row], [0], [10], [10 + generated], pool)
        if generated >= 3:
            assert penalties is None  # nothing left to do: the batch takes the fast path
            continue
        assert penalties is not None
        got = apply_penalties(logits, penalties)[0]
        assert torch.isinf(got[[9, *EOS]]).all() and bool((got[[9, *EOS]] < 0).all())
        assert int(torch.isfinite(got).sum()) == VOCAB - 3


def test_plain_batch_has_no_penalties() -> None:
    """The fast path: requests without penalties build no penalty work at all."""
    plain = [SamplingParams(), SamplingParams(temperature=0.0, min_tokens=0, stop_token_ids=[3])]
    assert all(penalty_row(p, EOS, VOCAB) is None for p in plain)
    assert penalty_row(SamplingParams(min_tokens=2, ignore_eos=True), EOS, VOCAB) is None  # nothing to mask
    assert build_penalties([None, None], [0, 1], [3, 3], [5, 5], torch.zeros(3, 8, dtype=torch.int32)) is None
    assert sampling_tensors(plain, [0, 0], "cpu").penalties is None


def test_sampler_applies_penalties_before_greedy_and_temperature() -> None:
    """A bias of +100 makes the token the greedy choice and (at T=1) nearly every draw."""
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(9))
    params = [
        SamplingParams(temperature=0.0, logit_bias={"33": 100.0}),
        SamplingParams(seed=4, logit_bias={"34": 100.0}),
    ]
    rows = [penalty_row(p, EOS, VOCAB) for p in params]
    penalties = build_penalties(rows, [0, 1], [4, 4], [4, 4], torch.zeros(3, 8, dtype=torch.int32))
    tensors = replace(sampling_tensors(params, [0, 0], "cpu"), penalties=penalties)
    assert Sampler().sample(logits, tensors).tolist() == [33, 34]


# ---- end to end: greedy generation vs transformers' generate ---------------------------------

_GEN = torch.Generator().manual_seed(11)
PROMPTS = [torch.randint(1, 250, (n,), generator=_GEN).tolist() for n in (6, 19, 33)]
PROMPTS.append(PROMPTS[2][:24] + [3, 4, 5])  # shares 24 tokens with prompt 2: a prefix-cache hit


class NumpyFrequencyPresence(LogitsProcessor):
    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        out = numpy_frequency_presence(
            scores[0].numpy(), input_ids[0, self.prompt_len :].tolist(), self.frequency, self.presence
        )
        return torch.from_numpy(out).unsqueeze(0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    model = tiny_hf_model("llama", spread=0.2)
    path = tmp_path_factory.mktemp("penalties-llama")
    model.save_pretrained(path)
    return model, path


_MEMO: dict[tuple[int, bytes], list[int]] = {}


def hf_generate(model: torch.nn.Module, prompt: list[int], params: SamplingParams) -> list[int]:
    """transformers' greedy generate with the request's processors (memoised)."""
    key = (id(model), msgspec.json.encode([prompt, params]))
    if key not in _MEMO:
        _MEMO[key] = _hf_generate(model, prompt, params)
    return _MEMO[key]


def _hf_generate(model: torch.nn.Module, prompt: list[int], params: SamplingParams) -> list[int]:
    processors = LogitsProcessorList()
    if params.frequency_penalty or params.presence_penalty:
        processors.append(
            NumpyFrequencyPresence(len(prompt), params.frequency_penalty, params.presence_penalty)
        )
    stops = params.stop_token_ids or None
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=params.max_tokens,
            do_sample=False,
            repetition_penalty=params.repetition_penalty,
            sequence_bias=[[[int(k)], v] for k, v in params.logit_bias.items()] or None,
            min_new_tokens=params.min_tokens or None,
            eos_token_id=stops,
            logits_processor=processors,
            pad_token_id=0,
        )
    tokens = out[0, len(prompt) :].tolist()
    if stops:
        end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
        tokens = tokens[:end]
    return tokens


E2E = [
    SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, repetition_penalty=1.8),
    SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, frequency_penalty=1.5, presence_penalty=0.7
    ),
    SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logit_bias={"77": 6.0, "12": -50.0}),
    SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, repetition_penalty=0.7, presence_penalty=1.0
    ),
]


@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_with_penalties_matches_transformers_generate(tiny, overlap: bool) -> None:
    """Mixed batch (each prompt with each setting, plus plain requests); a second run hits the
    prefix cache, whose prompt tokens the penalties must still see."""
    model, path = tiny
    llm = LLM(str(path), device="cpu", attention="torch", page_size=4, overlap=overlap)
    plain = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    chosen = [PROMPTS[0], PROMPTS[2], PROMPTS[3]]
    prompts = [p for p in chosen for _ in range(len(E2E) + 1)]
    params = [*E2E, plain] * len(chosen)
    for _ in range(2):
        results = llm.generate(prompts, params)
        for prompt, sp, result in zip(prompts, params, results, strict=True):
            assert result.error is None, result.error
            assert result.choices[0].token_ids == hf_generate(model, prompt, sp), sp
    assert results[-1].usage.cached_tokens > 0
    tokens = [r.choices[0].token_ids for r in results]
    for j in range(len(E2E)):  # each setting changes some output
        assert any(tokens[k + j] != tokens[k + len(E2E)] for k in range(0, len(tokens), len(E2E) + 1))


def test_min_tokens_matches_transformers_generate(tiny) -> None:
    """Stop ids the greedy stream would hit early are held off until min_tokens, as
    transformers' min_new_tokens does; without min_tokens the same ids stop it at once."""
    model, path = tiny
    llm = LLM(str(path), device="cpu", attention="torch")
    for prompt in PROMPTS[:3]:
        free = hf_generate(model, prompt, SamplingParams(max_tokens=12, temperature=0.0))
        stops = free[:3]  # the first tokens it would generate
        for min_tokens in (0, 5):
            sp = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=stops, min_tokens=min_tokens)
            got = llm.generate([prompt], sp)[0].choices[0]
            expected = hf_generate(model, prompt, sp)
            assert got.token_ids == expected
            assert len(got.token_ids) >= min_tokens
            assert got.finish_reason == ("length" if len(expected) == 12 else "stop")


def test_logit_bias_outside_vocabulary_is_that_jobs_error(tiny) -> None:
    _, path = tiny
    llm = LLM(str(path), device="cpu", attention="torch")
    bad = SamplingParams(max_tokens=4, logit_bias={"3": 1.0, "256": 2.0})
    good = SamplingParams(max_tokens=4, temperature=0.0, logit_bias={"255": 1.0})
    results = llm.generate([PROMPTS[0], PROMPTS[1]], [bad, good])
    assert results[0].error is not None and results[0].error.code == "invalid_job"
    assert "logit_bias" in results[0].error.message and "256" in results[0].error.message
    assert results[1].error is None and len(results[1].choices[0].token_ids) == 4


def test_stop_strings_and_ids_wait_for_min_tokens() -> None:
    """check_stop before min_tokens: only the length ends a choice (vLLM's rule); from then on
    stop ids and stop strings do."""
    from worker.scheduler.req import PendingReq, Req, RequestGroup
    from worker.scheduler.stop import check_stop

    def stop_after(output: list[int], **fields):
        sampling = SamplingParams(max_tokens=10, stop=["b"], stop_token_ids=[9], **fields)
        group = RequestGroup(uid="g", prompt_len=2, n=1)
        pending = PendingReq(group, 0, [1, 2, *output], sampling, 12, 0)
        req = Req(pending, 0, 1, 2 + len(output), 12, None, 0, 16)
        return check_stop(req, frozenset(EOS), lambda ids: "".join("ab"[t % 2] for t in ids))

    for output in ([9], [5], [3], [1, 9]):  # stop id, EOS, stop string "b", stop id
        assert stop_after(output) is not None
        assert stop_after(output, min_tokens=3) is None
    assert stop_after([4, 4, 9], min_tokens=3) is not None  # the third token may stop it
    assert stop_after([4] * 10, min_tokens=10).finish_reason == "length"


def test_repetition_penalty_is_bounded_where_float32_logits_stay_finite() -> None:
    """A repetition_penalty that float32 reads as 0 or as a subnormal turned a repeated token's
    positive logit into +inf (sampling then drew from NaN probabilities): such values are the
    job's error naming the field; at the lowest accepted value, logits up to the float32
    range's 1e30 stay finite, as transformers' processor computes them."""
    from wire.schema import JobError

    for tiny_value in (1e-300, 1e-40, 1e-3):
        with pytest.raises(JobError) as info:
            SamplingParams(repetition_penalty=tiny_value)
        assert info.value.field == "repetition_penalty"
    lowest = SamplingParams(repetition_penalty=0.01)
    logits = torch.tensor([[1e30, -1e30, 3.0, 0.5] + [0.0] * (VOCAB - 4)])
    row = penalty_row(lowest, EOS, VOCAB)
    pool = torch.zeros(1, 8, dtype=torch.int32)
    pool[0, :4] = torch.tensor([0, 1, 2, 3])
    penalties = build_penalties([row], [0], [4], [4], pool)
    assert penalties is not None
    got = apply_penalties(logits, penalties)
    expected = RepetitionPenaltyLogitsProcessor(0.01)(torch.tensor([[0, 1, 2, 3]]), logits.clone())
    assert torch.isfinite(got).all() and torch.equal(got, expected)


def test_a_batch_of_large_logit_bias_rows_builds_each_rows_additions() -> None:
    """256 requests with the largest logit_bias (1,024 entries each) and min_tokens: the
    batch's sparse additions equal the per-row dicts. What one build costs (the per-step cost
    every request of the batch would pay) is measured on purpose by
    ``python benchmarks/speed_checks.py penalties`` (docs/performance.md), not asserted here."""
    from wire.schema import MAX_LOGIT_BIAS

    rows = []
    for i in range(256):
        bias = {str((i * 7 + j * 40) % 49152): float(j % 200 - 100) for j in range(MAX_LOGIT_BIAS)}
        rows.append(penalty_row(SamplingParams(logit_bias=bias, min_tokens=9), EOS, 49152))
    pool = torch.zeros(256, 16, dtype=torch.int32)
    penalties = build_penalties(rows, list(range(256)), [4] * 256, [5] * 256, pool)
    assert penalties is not None
    got: dict[tuple[int, int], float] = {}
    for r, t, v in zip(
        penalties.sparse_rows.tolist(),
        penalties.sparse_tokens.tolist(),
        penalties.sparse_values.tolist(),
        strict=True,
    ):
        got[(r, t)] = got.get((r, t), 0.0) + v
    for i, row in enumerate(rows):
        assert row is not None
        expected = {(i, t): b for t, b in row.bias.items()}
        for stop in row.stop_tokens:
            expected[(i, stop)] = expected.get((i, stop), 0.0) + float("-inf")
        assert {k: v for k, v in got.items() if k[0] == i} == expected
