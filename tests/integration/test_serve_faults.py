"""`radixq serve` when things go wrong: the service SIGKILLed mid-batch and restarted, two
services with the holder of a batch killed, and bad input of every kind, each answered with the
OpenAI error body and status (real redis-server, real `radixq worker` processes with the fake
generator, the official `openai` package as the client)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.fake_generator import fake_text
from tests.integration.procs import start_worker
from tests.integration.serve_procs import (
    API_KEY,
    CHAT,
    Service,
    chat_body,
    request_line,
    rows,
    start_service,
    stop,
    wait_counts,
    wait_final,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
SLOW = {"RADIXQ_FAKE_LATENCY_S": "0.05", "RADIXQ_FAKE_CAPACITY": "2"}


def upload_and_create(client: openai.OpenAI, path: Path, count: int) -> tuple[str, list[str]]:
    ids = [f"r{i}" for i in range(count)]
    path.write_text("".join(request_line(c, chat_body(c)) + "\n" for c in ids))
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h").id, ids


def check_exactly_once(client: openai.OpenAI, batch_id: str, ids: list[str], log: Path) -> None:
    done = wait_final(client, batch_id, log)
    assert done.status == "completed", done
    output, errors = rows(client, done.output_file_id), rows(client, done.error_file_id)
    assert errors == [] and Counter(row["custom_id"] for row in output) == Counter(ids)
    for row in output:
        body = ChatCompletion.model_validate(row["response"]["body"], strict=True)
        assert body.choices[0].message.content == fake_text(f"{batch_id}/{row['custom_id']}")
    assert done.request_counts is not None and done.request_counts.completed == len(ids)


def test_a_service_killed_mid_batch_and_restarted_completes_it_once(redis_url: str, tmp_path: Path) -> None:
    first = start_service(redis_url, tmp_path / "data", tmp_path / "serve1.log")
    start_worker(redis_url, "w", tmp_path / "w.log", **SLOW)
    batch_id, ids = upload_and_create(first.client(), tmp_path / "in.jsonl", 150)
    wait_counts(first.client(), batch_id, 20, first.log)
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    second = start_service(redis_url, tmp_path / "data", tmp_path / "serve2.log")
    try:
        check_exactly_once(second.client(), batch_id, ids, second.log)
    finally:
        stop(second.proc)


def test_two_services_the_other_takes_a_batch_over_when_its_holder_dies(
    redis_url: str, tmp_path: Path
) -> None:
    services = [start_service(redis_url, tmp_path / "data", tmp_path / f"serve{i}.log") for i in range(2)]
    start_worker(redis_url, "w", tmp_path / "w.log", **SLOW)
    batch_id, ids = upload_and_create(services[0].client(), tmp_path / "in.jsonl", 150)
    wait_counts(services[1].client(), batch_id, 20, services[1].log)
    holder: list[Service] = []
    wait_until(lambda: holder.extend(s for s in services if s.lock_holder(batch_id) == s.proc.pid) or holder,
               "one service to hold the batch's lock")  # fmt: skip
    (other,) = [s for s in services if s is not holder[0]]
    holder[0].proc.send_signal(signal.SIGKILL)
    holder[0].proc.wait()
    try:
        check_exactly_once(other.client(), batch_id, ids, other.log)
    finally:
        stop(other.proc)


def error_of(call: Any, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The error body of a call that must fail with ``status``: OpenAI's shape, all four fields."""
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    exc = caught.value
    body = exc.response.json()
    assert exc.status_code == status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert (exc.code, body["error"]["code"]) == (code, code), body
    if param is not None:
        assert body["error"]["param"] == param, body
    return dict(body["error"])


def test_bad_input_gets_the_openai_error_shape_and_status(redis_url: str, tmp_path: Path) -> None:
    service = start_service(
        redis_url, tmp_path / "data", tmp_path / "serve.log", "--max-file-bytes", "100000"
    )
    client = service.client()
    good = tmp_path / "good.jsonl"
    good.write_text(request_line("a", chat_body("a", model="served")) + "\n")
    try:
        # the key: missing, wrong
        # (the openai client refuses to send no key: a plain request)
        missing = httpx.get(service.url + "/v1/files")
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        body = missing.json()
        assert (
            set(body["error"]) == {"message", "type", "param", "code"}
            and "API key" in body["error"]["message"]
        )
        error_of(lambda: service.client("sk-wrong-key-123").files.list(), 401, "invalid_api_key")
        # upload: wrong purpose, too large, lines that cannot be requests
        error_of(lambda: client.files.create(file=good.open("rb"), purpose="fine-tune"), 400, param="purpose")
        big = tmp_path / "big.jsonl"
        big.write_text("".join(request_line(f"b{i}", chat_body("x" * 500)) + "\n" for i in range(300)))
        error_of(lambda: client.files.create(file=big.open("rb"), purpose="batch"), 413, "file_too_large")
        bad_json = tmp_path / "bad.jsonl"
        bad_json.write_text(request_line("a", chat_body("a")) + "\n{not json\n")
        message = error_of(
            lambda: client.files.create(file=bad_json.open("rb"), purpose="batch"), 400, "invalid_json_line"
        )
        assert message["message"].startswith("line 2:")
        twice = tmp_path / "twice.jsonl"
        twice.write_text("".join(request_line(c, chat_body(c)) + "\n" for c in ("a", "b", "a")))
        message = error_of(
            lambda: client.files.create(file=twice.open("rb"), purpose="batch"), 400, "duplicate_custom_id"
        )
        assert "line 3" in message["message"] and "line 1" in message["message"]
        no_id = tmp_path / "no_id.jsonl"
        no_id.write_text(json.dumps({"method": "POST", "url": CHAT, "body": chat_body("x")}) + "\n")
        error_of(
            lambda: client.files.create(file=no_id.open("rb"), purpose="batch"), 400, "missing_custom_id"
        )
        # nothing of the refused uploads is kept, in storage or in the list
        assert client.files.list().data == [] and sorted((tmp_path / "data" / "files").iterdir()) == []
        # unknown ids
        error_of(lambda: client.files.retrieve("file-nope"), 404, param="file_id")
        error_of(lambda: client.files.content("file-nope"), 404)
        error_of(lambda: client.batches.retrieve("batch_nope"), 404, param="batch_id")
        error_of(lambda: client.batches.cancel("batch_nope"), 404, param="batch_id")
        create = client.batches.create
        error_of(lambda: create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h"), 404)
        # a model no worker serves, once a worker announces its served names
        uploaded = client.files.create(file=good.open("rb"), purpose="batch")
        error_of(lambda: create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"),  # type: ignore[arg-type]
                 400, param="endpoint")  # fmt: skip
        error_of(lambda: create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="1 week"),  # type: ignore[arg-type]
                 400, param="completion_window")  # fmt: skip
        other = tmp_path / "other.jsonl"
        other.write_text(request_line("a", chat_body("a", model="nope")) + "\n")
        other_file = client.files.create(file=other.open("rb"), purpose="batch")
        start_worker(redis_url, "w", tmp_path / "w.log", "--served-model-name", "served")
        wait_until(lambda: client.models.list().data, "the worker's served names", service.log)
        error_of(lambda: create(input_file_id=other_file.id, endpoint=CHAT, completion_window="24h"), 404,
                 "model_not_found", "model")  # fmt: skip
        assert (
            create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h").status == "validating"
        )
    finally:
        stop(service.proc)
    assert API_KEY not in service.log.read_text()
