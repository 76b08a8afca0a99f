"""The engine's greedy outputs equal transformers' generate(do_sample=False), token for token.

Small random Llama / Qwen2 / Qwen3 models are saved with save_pretrained and loaded by both
sides; every scenario (mixed lengths, chunked prefill, page sizes 1 and 16, prefix-cache
hits, forced retraction, overlap on and off, n > 1, stop conditions) is checked against HF,
the main ones with both CPU attention backends (the reference ``torch`` and ``sdpa``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.model_fixtures import tiny_hf_model
from wire.schema import SamplingParams
from worker.llm import LLM

SPREAD = 0.2
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
_GEN = torch.Generator().manual_seed(7)
PROMPTS = [torch.randint(1, 250, (n,), generator=_GEN).tolist() for n in (3, 9, 17, 40, 26)]
PROMPTS.append(PROMPTS[3][:20] + [7, 8, 9])  # shares a 20-token prefix with prompt 3
PROMPTS.append(list(PROMPTS[1]))  # a repeated prompt


def _hf_model(kind: str) -> torch.nn.Module:
    return tiny_hf_model(kind, spread=SPREAD)


class Oracle:
    """An HF model and its saved directory; memoised greedy continuations."""

    def __init__(self, kind: str, path: Path) -> None:
        self.model = _hf_model(kind)
        self.model.save_pretrained(path)
        self.path = path
        self._memo: dict[tuple, list[int]] = {}

    def greedy(self, prompt: list[int], max_new_tokens: int, eos: tuple[int, ...] = ()) -> list[int]:
        key = (tuple(prompt), max_new_tokens, eos)
        if key not in self._memo:
            with torch.no_grad():
                out = self.model.generate(
                    torch.tensor([prompt]),
                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    eos_token_id=list(eos) or None,
                    pad_token_id=0,
                )
            self._memo[key] = out[0, len(prompt) :].tolist()
        return self._memo[key]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def oracle(request, tmp_path_factory) -> Oracle:
    return Oracle(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Oracle:
    return Oracle("llama", tmp_path_factory.mktemp("llama-only"))


BACKENDS = pytest.mark.parametrize("attention", ["torch", "sdpa"])


def _llm(path: Path, **options) -> LLM:
    options = {"device": "cpu", "attention": "torch", **options}
    return LLM(str(path), **options)


def _assert_matches(oracle: Oracle, llm: LLM, prompts: list[list[int]], sampling: SamplingParams) -> list:
    results = llm.generate(prompts, sampling)
    for prompt, result in zip(prompts, results, strict=True):
        assert result.error is None, result.error
        expected = oracle.greedy(prompt, sampling.max_tokens)
        for choice in result.choices:
            assert choice.token_ids == expected, f"prompt of {len(prompt)} tokens"
            assert choice.finish_reason == "length"
    llm.scheduler.check_integrity()
    assert llm.scheduler.cache.num_private_pages == 0, "pages still held after every request finished"
    return results


@pytest.mark.parametrize(
    "options",
    [
        dict(page_size=1, overlap=True),
        dict(page_size=16, overlap=False, max_prefill_tokens=8),
        dict(page_size=16, overlap=True, max_prefill_tokens=8),
    ],
    ids=["page1-overlap", "page16-chunked", "page16-chunked-overlap"],
)
@BACKENDS
def test_mixed_batch_matches_hf(oracle: Oracle, options: dict, attention: str) -> None:
    """Mixed prompt lengths in one batch, with and without chunking, paging and overlap."""
    llm = _llm(oracle.path, attention=attention, **options)
    _assert_matches(oracle, llm, PROMPTS, GREEDY)
    if options.get("max_prefill_tokens") == 8:
        assert llm.scheduler.stats.steps > 40 // 8, "the 40-token prompt must have been chunked"


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("overlap", [True, False])
@BACKENDS
def test_prefix_cache_hits_match_hf(llama: Oracle, page_size: int, overlap: bool, attention: str) -> None:
    """Shared prefixes and repeated prompts are served from the radix cache, same tokens."""
    llm = _llm(llama.path, page_size=page_size, overlap=overlap, attention=attention)
    _assert_matches(llama, llm, [PROMPTS[3]], GREEDY)
    again = [PROMPTS[3], PROMPTS[5], PROMPTS[3] + [11, 12]]
    results = _assert_matches(llama, llm, again, GREEDY)
    cached = [r.usage.cached_tokens for r in results]
    assert all(c > 0 for c in cached), cached
    assert cached[0] == (len(PROMPTS[3]) - 1) // page_size * page_size


def test_naive_cache_matches_hf_without_hits(llama: Oracle) -> None:
    llm = _llm(llama.path, cache="naive", page_size=4)
    _assert_matches(llama, llm, [PROMPTS[3]], GREEDY)
    results = _assert_matches(llama, llm, [PROMPTS[3], PROMPTS[5]], GREEDY)
    assert [r.usage.cached_tokens for r in results] == [0, 0]


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("overlap", [True, False])
@BACKENDS
def test_retraction_under_tiny_pool_matches_hf(
    llama: Oracle, page_size: int, overlap: bool, attention: str
) -> None:
    """A KV pool far smaller than the work forces retraction; outputs are unchanged."""
    sampling = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    llm = _llm(
        llama.path,
        attention=attention,
        page_size=page_size,
        overlap=overlap,
        num_pages=64 // page_size,
        output_reserve_ratio=0.0,
    )
    _assert_matches(llama, llm, PROMPTS[:3] + PROMPTS[4:], sampling)
    assert llm.scheduler.stats.retractions > 0


def test_n_choices_share_the_prompt(llama: Oracle) -> None:
    """n=3 greedy choices all equal HF; siblings reuse the prompt's KV (1 token each)."""
    llm = _llm(llama.path, page_size=1)
    prompt = PROMPTS[3]
    result = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, n=3, ignore_eos=True))[0]
    expected = llama.greedy(prompt, 10)
    assert [c.index for c in result.choices] == [0, 1, 2]
    assert all(c.token_ids == expected for c in result.choices)
    assert llm.scheduler.stats.prefill_tokens == len(prompt) + 2
    assert result.usage.completion_tokens == 30


def test_stop_token_ids_and_model_eos(llama: Oracle, tmp_path: Path) -> None:
    """Stops at stop_token_ids and at every EOS id of the model config, like HF does."""
    prompt = PROMPTS[1]
    full = llama.greedy(prompt, 10)
    stop_token = full[4]
    cut = full.index(stop_token)
    llm = _llm(llama.path)
    result = llm.generate(
        [prompt], SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=[stop_token])
    )[0]
    assert result.choices[0].token_ids == full[:cut]
    assert result.choices[0].finish_reason == "stop"

    eos_dir = tmp_path / "eos"
    shutil.copytree(llama.path, eos_dir)
    config = json.loads((eos_dir / "config.json").read_text())
    config["eos_token_id"] = [255, stop_token]
    (eos_dir / "config.json").write_text(json.dumps(config))
    hf = llama.greedy(prompt, 10, eos=(255, stop_token))
    assert hf[-1] in (255, stop_token), "the oracle must itself stop on EOS for this check"
    llm = _llm(eos_dir, overlap=True)
    stopped, ignored = llm.generate(
        [prompt, prompt],
        [
            SamplingParams(max_tokens=10, temperature=0.0),
            SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
        ],
    )
    assert stopped.choices[0].token_ids == hf[:-1] and stopped.choices[0].finish_reason == "stop"
    assert ignored.choices[0].token_ids == full and ignored.choices[0].finish_reason == "length"


def test_context_limits(llama: Oracle) -> None:
    """max_tokens past the context is clamped (finish "length"); a too-long prompt is an error."""
    llm = _llm(llama.path, max_seq_len=20)
    prompt = PROMPTS[2][:15]
    clamped, too_long, bad_token = llm.generate(
        [prompt, PROMPTS[3][:20], [1, 2, 999]], SamplingParams(max_tokens=50, temperature=0.0)
    )
    assert clamped.choices[0].token_ids == llama.greedy(prompt, 5)
    assert clamped.choices[0].finish_reason == "length"
    assert too_long.error is not None and too_long.error.code == "prompt_too_long" and not too_long.choices
    assert bad_token.error is not None and bad_token.error.code == "invalid_job"
    assert "999" in bad_token.error.message
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("cache", ["radix", "naive"])
def test_shared_prefix_in_one_batch_is_computed_once(llama: Oracle, cache: str) -> None:
    """Jobs arriving together with a common 64-token prefix: radix computes it once."""
    system = torch.randint(1, 250, (64,), generator=torch.Generator().manual_seed(5)).tolist()
    prompts = [system + [10 + i, 20 + i, 30 + i] for i in range(6)]
    llm = _llm(llama.path, page_size=16, cache=cache)
    results = _assert_matches(llama, llm, prompts, SamplingParams(max_tokens=4, temperature=0.0))
    computed = llm.scheduler.stats.prefill_tokens
    if cache == "radix":
        assert [r.usage.cached_tokens for r in results] == [0] + [64] * 5
        assert computed == len(prompts[0]) + 5 * 3
    else:
        assert computed == sum(len(p) for p in prompts)
