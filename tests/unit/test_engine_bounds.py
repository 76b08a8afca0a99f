"""Requests at every bound SamplingParams accepts run on the real scheduler and engine (CPU,
tiny random model) to a normal finish; a vanishing temperature samples greedily."""

from __future__ import annotations

import msgspec
import pytest
import torch

from tests.model_fixtures import TINY_SHAPE, hf_greedy, tiny_hf_model
from wire.bounds import TOKEN_ID_LIMIT
from wire.schema import (
    MAX_N,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    MAX_TOKENS_LIMIT,
    MAX_TOP_K,
    MIN_TOP_P,
    SamplingParams,
)
from worker.llm import LLM
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest, RequestFinished, encoder, inbound_decoder

VOCAB = TINY_SHAPE["vocab_size"]
_GEN = torch.Generator().manual_seed(5)
PROMPTS = [torch.randint(1, 250, (n,), generator=_GEN).tolist() for n in (4, 11, 23)]


@pytest.fixture(scope="module")
def hf_and_dir(tmp_path_factory):
    model = tiny_hf_model("llama", spread=0.2)
    path = tmp_path_factory.mktemp("bounds-llama")
    model.save_pretrained(path)
    return model, path


AT_THE_BOUNDS = {
    "top_k_max": SamplingParams(max_tokens=5, top_k=MAX_TOP_K, seed=1),
    "top_k_vocab": SamplingParams(max_tokens=5, top_k=VOCAB, seed=2),
    "top_k_below_vocab": SamplingParams(max_tokens=5, top_k=VOCAB - 1, seed=3),
    "seed_max": SamplingParams(max_tokens=5, seed=2**63 - 1, n=3),
    "stop_ids_max": SamplingParams(
        max_tokens=5, stop_token_ids=[TOKEN_ID_LIMIT - 1] * MAX_STOP_TOKEN_IDS, ignore_eos=True
    ),
    "stop_strings_max": SamplingParams(max_tokens=5, stop=["~" * MAX_STOP_CHARS] * MAX_STOP_STRINGS),
    "temperature_tiny": SamplingParams(max_tokens=5, temperature=1e-45),
    "temperature_max": SamplingParams(max_tokens=5, temperature=MAX_TEMPERATURE, top_p=0.5, min_p=0.5),
    "top_p_min": SamplingParams(max_tokens=5, top_p=MIN_TOP_P, seed=4),
    "min_p_max": SamplingParams(max_tokens=5, min_p=1.0, seed=5),
    "n_max": SamplingParams(max_tokens=2, n=MAX_N, seed=6),
    "max_tokens_max": SamplingParams(max_tokens=MAX_TOKENS_LIMIT, temperature=0.0, ignore_eos=True),
}


def test_requests_at_every_bound_finish(hf_and_dir) -> None:
    _, path = hf_and_dir
    io = InMemoryIO()
    config = SchedulerProcessConfig.from_options(
        str(path), device="cpu", attention="torch", page_size=4, max_seq_len=48
    )
    scheduler = build_scheduler(config, io, detokenize=lambda ids: "".join(chr(97 + t % 26) for t in ids))
    for i, (uid, sampling) in enumerate(AT_THE_BOUNDS.items()):
        request = GenerateRequest(uid=uid, input_ids=PROMPTS[i % len(PROMPTS)], sampling=sampling)
        io.put(inbound_decoder.decode(encoder.encode(request)))  # as it crosses the process boundary
    finished: dict[str, RequestFinished] = {}
    last = None
    for _ in range(2_000):
        last = scheduler.step(last, block=False)
        finished |= {m.uid: m for m in io.take_all() if isinstance(m, RequestFinished)}
        if last is None and scheduler.idle:
            break
    assert sorted(finished) == sorted(AT_THE_BOUNDS)
    for uid, sampling in AT_THE_BOUNDS.items():
        message = finished[uid]
        assert message.error_code is None, (uid, message.error_message)
        assert [c.index for c in message.choices] == list(range(sampling.n)), uid
        for choice in message.choices:
            assert choice.finish_reason == "length" and all(0 <= t < VOCAB for t in choice.token_ids), uid
    prompt_len = len(PROMPTS[(len(AT_THE_BOUNDS) - 1) % len(PROMPTS)])
    assert len(finished["max_tokens_max"].choices[0].token_ids) == 48 - prompt_len  # clamped to the context


def test_temperatures_below_epsilon_are_greedy(hf_and_dir) -> None:
    """Regression (issue 8, point 7): temperature 1e-45 gave garbage (logits / 1e-45 overflow)."""
    model, path = hf_and_dir
    llm = LLM(str(path), device="cpu", attention="torch")
    base = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    for temperature in (0.0, 1e-45, 5e-6):
        sampling = msgspec.structs.replace(base, temperature=temperature, seed=7)
        results = llm.generate(PROMPTS, sampling)
        assert [r.choices[0].token_ids for r in results] == [hf_greedy(model, p, 10) for p in PROMPTS]
