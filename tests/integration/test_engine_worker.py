"""The real engine behind the queue: `radixq worker` (SmolLM2, CPU) against a real redis-server.

The oracle is Hugging Face transformers' greedy `generate` on the same converted weights:
what comes out of the queue must be the same tokens, with stop strings trimmed from the text
and bad jobs answered with an error row while the others complete.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.integration.procs import REPO_ROOT, radixq, subprocess_env
from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import LIVENESS_S

pytestmark = [pytest.mark.integration, pytest.mark.model]

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _hf_greedy(model_dir: Path, input_ids: list[int], max_new_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([input_ids]),
            attention_mask=torch.ones(1, len(input_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.generation_config.eos_token_id,
        )
    return out[0, len(input_ids) :].tolist()


def test_engine_worker_matches_transformers_through_redis(
    redis_url: str,
    tmp_path: Path,
    smollm2_dir: Path,  # noqa: F811
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    chat_text = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    chat_ids = tokenizer(chat_text, add_special_tokens=False)["input_ids"]
    story_ids = tokenizer("Once upon a time")["input_ids"]
    jobs = [
        {"id": "chat", "messages": CHAT, "max_tokens": 16, "temperature": 0, "metadata": {"k": 1}},
        {"id": "story", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "ignore_eos": True},
        {"id": "stop", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stop": ["."]},
        {"id": "toolong", "input_ids": [1] * 9000, "max_tokens": 4},
        {"id": "sampled", "messages": CHAT, "max_tokens": 8, "temperature": 0.8, "seed": 7, "n": 2},
    ]
    source = tmp_path / "jobs.jsonl"
    source.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    enqueued = radixq("enqueue", str(source), "--redis-url", redis_url)
    assert enqueued.returncode == 0, enqueued.stderr

    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "radixq", "worker", "--redis-url", redis_url, "--device", "cpu"],
            cwd=REPO_ROOT,
            env=subprocess_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        out = tmp_path / "out.jsonl"
        collected = radixq(
            "collect", "-o", str(out), "--redis-url", redis_url, "--timeout", "400", timeout_s=420
        )
        # Exit 1: the "toolong" job's error row (every other job succeeds, checked below).
        assert collected.returncode == 1, collected.stderr + log_path.read_text()
        assert "1 job failed" in collected.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0, log_path.read_text()

    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert list(rows) == [job["id"] for job in jobs]

    chat = rows["chat"]
    assert chat["error"] is None and chat["metadata"] == {"k": 1}
    expected_chat = _hf_greedy(smollm2_dir, chat_ids, 16)
    eos = expected_chat.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in expected_chat else None
    assert chat["choices"][0]["token_ids"] == expected_chat[:eos]
    assert chat["choices"][0]["text"].startswith("The capital of France is Paris")
    assert chat["choices"][0]["finish_reason"] == "stop"
    assert chat["usage"]["prompt_tokens"] == len(chat_ids)

    story = rows["story"]["choices"][0]
    expected_story = _hf_greedy(smollm2_dir, story_ids, 24)
    assert story["token_ids"] == expected_story
    assert story["finish_reason"] == "length"
    full_text = tokenizer.decode(expected_story, skip_special_tokens=True)
    assert story["text"] == full_text

    stop = rows["stop"]["choices"][0]
    assert "." in full_text, "the oracle text must contain the stop string for this check"
    assert stop["text"] == full_text[: full_text.index(".")]
    assert stop["finish_reason"] == "stop"

    toolong = rows["toolong"]
    assert toolong["choices"] == [] and toolong["error"]["code"] == "prompt_too_long"
    assert "toolong" in toolong["error"]["message"]

    sampled = rows["sampled"]["choices"]
    assert [c["index"] for c in sampled] == [0, 1]
    assert all(1 <= len(c["token_ids"]) <= 8 for c in sampled)
