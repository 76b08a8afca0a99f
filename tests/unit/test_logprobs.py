"""Logprobs on SmolLM2-135M-Instruct (GGUF, CPU, fp32) against transformers' log-softmax.

Oracle: one transformers forward over prompt + generated tokens; the log-softmax of its
logits at each generated position. radixq reports raw logprobs (before penalties and
temperature), so sampled and penalised requests compare against the same oracle.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch

from producer.output_lines import output_record
from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from wire.schema import Choice, SamplingParams
from worker.llm import LLM

pytestmark = pytest.mark.model
TOLERANCE = 1e-3  # against transformers
BATCH_TOLERANCE = 1e-4  # the same request in different batches
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    [{"role": "user", "content": "Name three colors."}],
]


@pytest.fixture(scope="module")
def setup(smollm2_dir: Path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    llm = LLM(str(smollm2_dir), device="cpu", attention="torch", page_size=16, max_seq_len=1024)
    return hf, llm


def hf_logprobs(hf, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """[len(output), vocab] log-softmax of transformers' logits where each output token was chosen."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt_ids + output_ids])).logits[0].float()
    start = len(prompt_ids) - 1
    return torch.log_softmax(logits[start : start + len(output_ids)], dim=-1)


def max_error(choice: Choice, expected: torch.Tensor, top: int) -> float:
    """Largest difference from the oracle over sampled and top logprobs; asserts the shapes
    and that the top entries are the oracle's top values (ids may swap only on near-ties)."""
    assert choice.logprobs is not None and len(choice.logprobs) == len(choice.token_ids)
    worst = 0.0
    for entry, row in zip(choice.logprobs, expected, strict=True):
        worst = max(worst, abs(entry.logprob - float(row[entry.token_id])))
        assert len(entry.top_logprobs) == top
        best = row.topk(top).values
        for rank, alt in enumerate(entry.top_logprobs):
            worst = max(
                worst, abs(alt.logprob - float(row[alt.token_id])), abs(alt.logprob - float(best[rank]))
            )
    return worst


def test_greedy_logprobs_match_transformers(setup) -> None:
    hf, llm = setup
    params = [
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=True, top_logprobs=5),
        SamplingParams(max_tokens=8, temperature=0.0, logprobs=True, top_logprobs=20),
        SamplingParams(max_tokens=24, temperature=0.0, logprobs=True),  # may end on EOS: dropped
    ]
    results = llm.generate(PROMPTS, params)
    for prompt, sp, result in zip(PROMPTS, params, results, strict=True):
        choice = result.choices[0]
        expected = hf_logprobs(hf, llm.encode(prompt), choice.token_ids)
        assert max_error(choice, expected, sp.top_logprobs) < TOLERANCE
        for entry in choice.logprobs or []:
            assert entry.token == llm.tokenizer.decode([entry.token_id], skip_special_tokens=False)
            if sp.top_logprobs:
                assert entry.top_logprobs[0].token_id == entry.token_id  # greedy: the most likely


def test_logprobs_are_raw_under_sampling_and_penalties(setup) -> None:
    """Temperature and penalties change the draw, not the reported logprobs."""
    hf, llm = setup
    params = [
        SamplingParams(max_tokens=6, temperature=1.7, seed=3, logprobs=True, top_logprobs=3),
        SamplingParams(max_tokens=6, temperature=0.0, repetition_penalty=1.5, logprobs=True, top_logprobs=3),
        SamplingParams(max_tokens=6, temperature=0.6, top_p=0.5, n=2, seed=8, logprobs=True, top_logprobs=2),
    ]
    results = llm.generate(PROMPTS, params)
    for prompt, sp, result in zip(PROMPTS, params, results, strict=True):
        assert len(result.choices) == sp.n
        for choice in result.choices:
            expected = hf_logprobs(hf, llm.encode(prompt), choice.token_ids)
            assert max_error(choice, expected, sp.top_logprobs) < TOLERANCE


def test_logprobs_do_not_depend_on_the_batch(setup) -> None:
    """The same greedy request alone and amid different requests (longer prompts, penalties,
    sampling, no logprobs, chunked prefill): the same tokens, logprobs within 1e-4."""
    _, llm = setup
    target = SamplingParams(max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=4)
    alone = llm.generate([PROMPTS[1]], target)[0].choices[0]
    crowd_llm = LLM(
        str(llm.config.model), device="cpu", attention="torch", page_size=4, max_prefill_tokens=48
    )
    crowd_prompts = [PROMPTS[2], "Once upon a time " * 5, PROMPTS[1], PROMPTS[0]]
    crowd_params = [
        SamplingParams(max_tokens=8, temperature=0.9, seed=1, logprobs=True, top_logprobs=20),
        SamplingParams(max_tokens=6, frequency_penalty=1.0, logit_bias={"42": 5.0}),
        target,
        SamplingParams(max_tokens=3, temperature=0.0),
    ]
    crowd = crowd_llm.generate(crowd_prompts, crowd_params)[2].choices[0]
    assert crowd.token_ids == alone.token_ids
    assert alone.logprobs is not None and crowd.logprobs is not None
    for a, b in zip(alone.logprobs, crowd.logprobs, strict=True):
        assert abs(a.logprob - b.logprob) < BATCH_TOLERANCE
        assert [t.token_id for t in a.top_logprobs] == [t.token_id for t in b.top_logprobs]
        for x, y in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert abs(x.logprob - y.logprob) < BATCH_TOLERANCE


def test_native_rows_carry_logprobs(setup) -> None:
    """The JSONL result row: logprobs per choice when asked, none otherwise."""
    _, llm = setup
    asked, plain = llm.generate(
        [PROMPTS[0], PROMPTS[0]],
        [
            SamplingParams(max_tokens=4, temperature=0.0, logprobs=True, top_logprobs=2),
            SamplingParams(max_tokens=4, temperature=0.0),
        ],
    )
    row = msgspec.json.decode(msgspec.json.encode(output_record(asked)))
    entries = row["choices"][0]["logprobs"]
    assert [e["token_id"] for e in entries] == asked.choices[0].token_ids
    assert set(entries[0]) == {"token_id", "token", "logprob", "top_logprobs"}
    assert set(entries[0]["top_logprobs"][0]) == {"token_id", "token", "logprob"}
    assert len(entries[0]["top_logprobs"]) == 2
    assert output_record(plain)["choices"][0].get("logprobs") is None
