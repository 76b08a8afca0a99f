"""OpenAI Batch request lines run by the real engine (SmolLM2-135M-Instruct on CPU): the
response bodies validate strictly against the `openai` package's types, and a completions
request with a list of prompts answers each prompt's choices with what transformers' greedy
generate gives for that prompt alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from openai.types import Completion
from openai.types.chat import ChatCompletion

from producer.jsonl import parse_line
from producer.output_lines import output_record
from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import drive_until
from wire.schema import Result
from worker.frontend.engine_generator import EngineGenerator
from worker.frontend.prompts import PromptLists
from worker.queue.held import envelope
from worker.scheduler.config import SchedulerProcessConfig

pytestmark = pytest.mark.model
MAX_NEW = 6
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def _line(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _hf_greedy(hf: Any, tokenizer: Any, prompt: str) -> list[int]:
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=MAX_NEW,
            do_sample=False,
        )
    eos = hf.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    tokens = out[0, len(ids) :].tolist()
    return [t for t in tokens if t not in eos]


def test_openai_lines_on_the_real_model(smollm2_dir: Path) -> None:  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    chat = {
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Capital of France?"}]},
        ],
        "temperature": None,
        "max_completion_tokens": MAX_NEW,
        "seed": 1,
        "user": "u",
    }
    multi = {"model": "smollm2", "prompt": PROMPTS, "n": 2, "max_tokens": MAX_NEW, "temperature": 0}
    jobs = [
        parse_line(_line("chat", "/v1/chat/completions", chat), 1),
        parse_line(_line("multi", "/v1/completions", multi), 2),
    ]
    generator = PromptLists(
        EngineGenerator(
            SchedulerProcessConfig.from_options(str(smollm2_dir), device="cpu", max_running_reqs=4)
        )
    )
    try:
        # the scheduler process is loading
        drive_until(lambda: generator.free_capacity() > 0, lambda: generator.poll(0.2), "the engine to load")
        for job in jobs:
            generator.submit(job)
        results: dict[str, Result] = {}
        by_id = {job.id: job for job in jobs}

        def take() -> None:
            results.update(
                {r.id: envelope(r, by_id[r.id], 0, "w", generator.model_name) for r in generator.poll(0.5)}
            )

        drive_until(lambda: len(results) >= len(jobs), take, "every result")
    finally:
        generator.close()

    chat_out = output_record(results["chat"])["response"]["body"]
    ChatCompletion.model_validate(chat_out, strict=True)
    assert chat_out["choices"][0]["message"]["content"]

    body = Completion.model_validate(output_record(results["multi"])["response"]["body"], strict=True)
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    merged = results["multi"]
    assert [c.index for c in body.choices] == [0, 1, 2, 3]
    for prompt_index, prompt in enumerate(PROMPTS):
        expected = _hf_greedy(hf, tokenizer, prompt)
        for c in range(2):
            choice = merged.choices[prompt_index * 2 + c]
            assert choice.token_ids == expected
            assert body.choices[prompt_index * 2 + c].text == choice.text
