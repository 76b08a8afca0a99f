"""An OpenAI Batch file as a user writes it from OpenAI's documentation, through `radixq run`
with workers as subprocesses: every response line validates strictly against the `openai`
package's types, a line with an unsupported field is rejected alone, ignored fields are
noted, a prompt list is one line, and a worker given served model names refuses other names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from tests.fake_generator import fake_text
from tests.integration.procs import FAKE_GENERATOR, radixq, subprocess_env
from worker.queue.prompts import sub_job_id

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def _request(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_openai_batch_file_end_to_end(tmp_path: Path) -> None:
    chat_body = {
        "model": "smol",
        "messages": [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Hi"}]},
        ],
        "temperature": None,
        "max_completion_tokens": 4,
        "logprobs": False,
        "frequency_penalty": 0,
        "response_format": {"type": "text"},
        "user": "u1",
        "store": False,
        "metadata": {"batch": "b1"},
    }
    lines = [
        _request("chat", CHAT, chat_body),
        _request("tools", CHAT, {**chat_body, "tools": [{"type": "function", "function": {"name": "f"}}]}),
        _request(
            "multi", "/v1/completions", {"model": "smol", "prompt": ["one", "two"], "n": 2, "best_of": 1}
        ),
        _request("other", CHAT, {**chat_body, "model": "gpt-4o"}),
    ]
    source = tmp_path / "batch.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    env = subprocess_env(RADIXQ_SERVED_MODEL_NAMES="smol")
    done = radixq("run", str(source), "-o", str(out), "--backend", FAKE_GENERATOR, "--timeout", "60", env=env)
    assert done.returncode == 1, done.stderr  # a rejected line and a failed job
    assert f"rejected {source}:line 2: " in done.stderr and "body.tools" in done.stderr
    assert "body.user on 2 lines: accepted and ignored" in done.stderr
    rows = {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == ["chat", "multi", "other", "tools"]  # one row per input line
    tools = rows["tools"]
    assert tools["response"] is None and tools["error"]["code"] == "invalid_job"
    assert "body.tools" in tools["error"]["message"]

    chat = ChatCompletion.model_validate(rows["chat"]["response"]["body"], strict=True)
    assert chat.choices[0].message.content == fake_text("chat") and chat.choices[0].logprobs is None
    assert chat.model == "fake-model" and rows["chat"]["response"]["body"]["metadata"] == {"batch": "b1"}

    multi = Completion.model_validate(rows["multi"]["response"]["body"], strict=True)
    assert [c.text for c in multi.choices] == [
        fake_text(sub_job_id("multi", p), c) for p in range(2) for c in range(2)
    ]

    other = rows["other"]
    assert other["response"] is None and other["error"]["code"] == "model_not_served"
    assert "'gpt-4o'" in other["error"]["message"]
