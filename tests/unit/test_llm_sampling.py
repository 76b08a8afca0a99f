"""Seeded sampling through LLM: same outputs run to run and whatever the batch around them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.llm import LLM

_GEN = torch.Generator().manual_seed(3)
PROMPTS = [torch.randint(1, 250, (n,), generator=_GEN).tolist() for n in (5, 12, 30, 8)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sampling-llama")
    tiny_hf_model("llama").save_pretrained(path)
    return path


def _llm(path: Path, **options) -> LLM:
    return LLM(str(path), device="cpu", attention="torch", **options)


def _tokens(results) -> list[list[list[int]]]:
    return [[c.token_ids for c in r.choices] for r in results]


def test_seeded_outputs_repeat_and_ignore_batch_composition(model_dir: Path) -> None:
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    first = _tokens(_llm(model_dir).generate(PROMPTS, seeded))
    assert first == _tokens(_llm(model_dir, overlap=False).generate(PROMPTS, seeded))
    alone = _tokens(_llm(model_dir, page_size=4).generate([PROMPTS[2]], seeded))
    assert alone[0] == first[2]
    mixed = [SamplingParams(max_tokens=5, temperature=0.7, seed=9, ignore_eos=True), seeded]
    crowd = _tokens(_llm(model_dir, max_prefill_tokens=8).generate([PROMPTS[0], PROMPTS[2]], mixed))
    assert crowd[1] == first[2]
    greedy = _tokens(_llm(model_dir).generate([PROMPTS[2]], SamplingParams(max_tokens=12, temperature=0.0)))
    assert greedy[0] != first[2], "temperature 1.0 should differ from greedy somewhere in 12 tokens"


def test_n_choices_use_seed_plus_index(model_dir: Path) -> None:
    llm = _llm(model_dir)
    base = SamplingParams(max_tokens=10, temperature=1.0, seed=50, ignore_eos=True)
    group = llm.generate(
        [PROMPTS[1]], SamplingParams(max_tokens=10, temperature=1.0, seed=50, n=3, ignore_eos=True)
    )
    singles = [
        llm.generate(
            [PROMPTS[1]], SamplingParams(max_tokens=10, temperature=1.0, seed=50 + i, ignore_eos=True)
        )[0]
        for i in range(3)
    ]
    assert _tokens(group)[0] == [s.choices[0].token_ids for s in singles]
    assert len({tuple(t) for t in _tokens(group)[0]}) > 1, "different seeds should give different samples"
    assert _tokens(llm.generate([PROMPTS[1]], base))[0][0] == singles[0].choices[0].token_ids
