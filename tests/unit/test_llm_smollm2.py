"""The offline LLM API on SmolLM2-135M-Instruct (GGUF): greedy equals HF generate (with
penalties too), stop strings trim."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from wire.schema import SamplingParams
from worker.llm import LLM

pytestmark = pytest.mark.model
MAX_NEW = 16
TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def setup(smollm2_dir: Path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    llm = LLM(str(smollm2_dir), device="cpu", page_size=16, max_seq_len=2048)  # the CPU default: sdpa
    return hf, llm


def _hf_greedy(hf, prompt_ids: list[int], **options) -> list[int]:
    """HF generate, stopping at the model's EOS; the EOS token itself is not output.
    ``options`` go to generate (logits processors)."""
    eos = hf.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            **options,
        )
    tokens = out[0, len(prompt_ids) :].tolist()
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i]
    return tokens


def test_greedy_matches_hf_generate(setup) -> None:
    hf, llm = setup
    prompts = [*TEXT_PROMPTS, CHAT]
    results = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
    for prompt, result in zip(prompts, results, strict=True):
        ids = llm.encode(prompt)
        expected = _hf_greedy(hf, ids)
        choice = result.choices[0]
        assert choice.token_ids == expected
        assert choice.text == llm.tokenizer.decode(expected, skip_special_tokens=True)
        assert choice.finish_reason == ("length" if len(expected) == MAX_NEW else "stop")
        assert result.usage.prompt_tokens == len(ids)
        assert result.usage.completion_tokens == len(expected)
    again = llm.generate([CHAT], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert again.usage.cached_tokens > 0  # the chat prompt's pages are in the radix cache


def test_stop_string_trims_text(setup) -> None:
    hf, llm = setup
    ids = llm.encode(TEXT_PROMPTS[1])
    full_text = llm.tokenizer.decode(_hf_greedy(hf, ids), skip_special_tokens=True)
    words = full_text.split()
    assert len(words) >= 3, full_text
    stop = words[2]
    result = llm.generate([ids], SamplingParams(max_tokens=MAX_NEW, temperature=0.0, stop=[stop]))[0]
    choice = result.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == full_text[: full_text.find(stop)]
    assert stop not in choice.text


def test_greedy_with_penalties_matches_hf_generate(setup) -> None:
    """Penalties in one batch, each against transformers' generate with the same processor
    (repetition: transformers' own; frequency/presence: the numpy formula of test_penalties)."""
    from transformers import LogitsProcessorList

    from tests.unit.test_penalties import NumpyFrequencyPresence

    hf, llm = setup
    prompt = llm.encode(TEXT_PROMPTS[1])
    params = [
        SamplingParams(max_tokens=MAX_NEW, temperature=0.0, repetition_penalty=1.3),
        SamplingParams(max_tokens=MAX_NEW, temperature=0.0, frequency_penalty=1.2, presence_penalty=0.5),
    ]
    processors = [
        {"repetition_penalty": 1.3},
        {"logits_processor": LogitsProcessorList([NumpyFrequencyPresence(len(prompt), 1.2, 0.5)])},
    ]
    plain = _hf_greedy(hf, prompt)
    results = llm.generate([prompt, prompt], params)
    for result, options in zip(results, processors, strict=True):
        expected = _hf_greedy(hf, prompt, **options)
        assert result.choices[0].token_ids == expected
        assert expected != plain  # the penalty changed the continuation
