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
from worker.frontend.prompts import sub_job_id

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
    done = radixq(
        "run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", "60", env=env
    )
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
    # the served name the request asked for, not the model that ran ("fake-model")
    assert chat.model == "smol" and rows["chat"]["response"]["body"]["metadata"] == {"batch": "b1"}

    multi = Completion.model_validate(rows["multi"]["response"]["body"], strict=True)
    assert [c.text for c in multi.choices] == [
        fake_text(sub_job_id("multi", p), c) for p in range(2) for c in range(2)
    ]

    other = rows["other"]
    assert other["response"] is None and other["error"]["code"] == "model_not_served"
    assert "'gpt-4o'" in other["error"]["message"]


def test_served_names_unknown_models_and_openai_ranges(tmp_path: Path) -> None:
    """Issue 17, item 5, as the guide's conformance table says: with --served-model-name the
    reply names the served name (the first one for a request naming none) and another name
    gets model_not_served; without served names an unknown name runs on the workers' model,
    which the reply names, with a note; a temperature past OpenAI's 2 rejects its line. Every
    body validates strictly against the openai package's ChatCompletion."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    lines = [
        _request("served", CHAT, {**body, "model": "my-model"}),
        _request("other", CHAT, {**body, "model": "my-other"}),
        _request("unknown", CHAT, {**body, "model": "no-such-model-xyz"}),
        _request("unnamed", CHAT, body),
        _request("hot", CHAT, {**body, "model": "my-model", "temperature": 5.5}),
        _request("warm", CHAT, {**body, "model": "my-model", "temperature": 2}),
    ]
    source = tmp_path / "batch.jsonl"
    source.write_text("\n".join(lines) + "\n")
    args = ["run", str(source), "--generator", FAKE_GENERATOR, "--timeout", "60"]
    served_out = tmp_path / "served.jsonl"
    done = radixq(
        *args, "-o", str(served_out), "--served-model-name", "my-model", "--served-model-name", "my-other"
    )
    assert done.returncode == 1, done.stderr
    assert "model 'no-such-model-xyz' on 1 line: not served" in done.stderr
    rows = {row["custom_id"]: row for row in map(json.loads, served_out.read_text().splitlines())}
    models = {
        name: ChatCompletion.model_validate(rows[name]["response"]["body"], strict=True).model
        for name in ("served", "other", "unnamed", "warm")
    }
    assert models == {"served": "my-model", "other": "my-other", "unnamed": "my-model", "warm": "my-model"}
    assert rows["unknown"]["error"]["code"] == "model_not_served" and rows["unknown"]["response"] is None
    assert (
        rows["hot"]["error"]["code"] == "invalid_job"
        and "body.temperature" in rows["hot"]["error"]["message"]
    )

    open_out = tmp_path / "open.jsonl"
    done = radixq(*args, "-o", str(open_out))
    assert done.returncode == 1, done.stderr  # the hot line
    assert (
        "model 'no-such-model-xyz' on 1 line: run by the workers' model, which the reply names" in done.stderr
    )
    rows = {row["custom_id"]: row for row in map(json.loads, open_out.read_text().splitlines())}
    unknown = ChatCompletion.model_validate(rows["unknown"]["response"]["body"], strict=True)
    assert unknown.model == "fake-model" and unknown.choices[0].message.content == fake_text("unknown")
