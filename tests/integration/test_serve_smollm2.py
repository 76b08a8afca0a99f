"""`radixq serve` with the real engine: a real `radixq worker` running SmolLM2-135M-Instruct on
the CPU serves a small batch driven by the official `openai` client; each greedy completion is
the text transformers generates greedily from the same weights (the oracle), and every response
validates strictly with the package's ChatCompletion."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

from tests.integration.procs import start_engine_worker
from tests.integration.serve_procs import CHAT, chat_body, request_line, rows, start_service, stop, wait_final
from tests.model_fixtures import hf_from_dir, hf_greedy, smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.model]
QUESTIONS = {"france": "What is the capital of France?", "sky": "Why is the sky blue?"}


def test_a_batch_on_smollm2_matches_transformers(redis_url: str, tmp_path: Path, smollm2_dir: Path) -> None:  # noqa: F811
    source = tmp_path / "batch.jsonl"
    lines = [
        request_line(name, chat_body(text, model="smol", max_tokens=12, temperature=0))
        for name, text in QUESTIONS.items()
    ]
    lines.append(request_line("hot", chat_body("x", model="smol", temperature=9)))
    source.write_text("\n".join(lines) + "\n")
    service = start_service(redis_url, tmp_path / "data", tmp_path / "serve.log")
    client = service.client()
    start_engine_worker(redis_url, smollm2_dir, tmp_path / "worker.log", "--served-model-name", "smol")
    try:
        wait_until(lambda: [m.id for m in client.models.list().data] == ["smol"], "the worker's served name",
                   tmp_path / "worker.log")  # fmt: skip
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
        done = wait_final(client, batch.id, service.log)
        output, errors = rows(client, done.output_file_id), rows(client, done.error_file_id)
    finally:
        stop(service.proc)
    assert done.status == "completed", done
    assert [row["custom_id"] for row in errors] == ["hot"] and errors[0]["error"]["code"] == "invalid_job"
    assert sorted(row["custom_id"] for row in output) == sorted(QUESTIONS)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = hf_from_dir(smollm2_dir)
    for row in output:
        body = ChatCompletion.model_validate(row["response"]["body"], strict=True)
        messages = [{"role": "user", "content": QUESTIONS[row["custom_id"]]}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        expected = hf_greedy(model, ids, 12)
        if tokenizer.eos_token_id in expected:
            expected = expected[: expected.index(tokenizer.eos_token_id)]
        assert body.choices[0].message.content == tokenizer.decode(expected, skip_special_tokens=True)
        assert body.model == "smol" and body.usage is not None and body.usage.prompt_tokens == len(ids)
