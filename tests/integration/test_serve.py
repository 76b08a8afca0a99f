"""`radixq serve` driven by the official `openai` package, against a real redis-server and real
`radixq worker` processes (the fake generator: its completion text is a function of the job id,
tests/fake_generator.py, so every row is checked against what that worker must have written).

Checked: the whole flow for a 200-line file with valid and invalid lines (every response
validates strictly with the package's own ChatCompletion and the batch with its Batch; the
custom_ids of the output and error files are the input's, each once; a model no worker announced
at create time fails as model_not_found when it runs); cancel mid-batch; the completion window
passing mid-batch (expired). The service runs as a Redis user with exactly the serve row of
docs/permissions.md.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from openai.types import Batch
from openai.types.chat import ChatCompletion

from tests.fake_generator import fake_text
from tests.integration.procs import start_worker
from tests.integration.serve_procs import (
    CHAT,
    chat_body,
    least_privilege,
    request_line,
    rows,
    start_service,
    stop,
    wait_counts,
    wait_final,
)
from tests.integration.test_url_io import s3, s3_text  # noqa: F401  (fixture)
from tests.waiting import wait_until
from wire.keys import META_RESULTS_TRIMMED, QueueKeys

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


def invalid_body(i: int) -> dict[str, Any]:
    """A request radixq rejects, one of several kinds."""
    kinds: list[dict[str, Any]] = [
        chat_body("hot", temperature=5.5),
        chat_body("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        chat_body("n", n=0),
        {"messages": [{"role": "robot", "content": "x"}]},
        chat_body("unknown", not_a_field=1),
    ]
    return kinds[i % len(kinds)]


def write_batch(path: Path, count: int, **fields: Any) -> list[str]:
    ids = [f"req-{i:03d}" for i in range(count)]
    path.write_text("".join(request_line(c, chat_body(c, **fields)) + "\n" for c in ids))
    return ids


def check_every_row_once(output: list[dict[str, Any]], errors: list[dict[str, Any]], ids: list[str]) -> None:
    listed = Counter(row["custom_id"] for row in output + errors)
    assert listed == Counter(ids), sorted(set(listed) ^ set(ids))


def test_a_200_line_batch_through_the_openai_client(redis_url: str, tmp_path: Path) -> None:
    lines, expected = [], {}
    for i in range(200):
        custom_id = f"req-{i:03d}"
        if i % 10 == 3:
            lines.append(request_line(custom_id, invalid_body(i)))
            expected[custom_id] = "invalid_job"
        elif i % 25 == 7:
            lines.append(request_line(custom_id, chat_body(f"q{i}", model="not-served")))
            expected[custom_id] = "model_not_found"
        elif i % 25 == 11:
            body = chat_body(f"q{i}", model="served", metadata={"fake_error": "internal"})
            lines.append(request_line(custom_id, body))
            expected[custom_id] = "internal"
        else:
            lines.append(request_line(custom_id, chat_body(f"q{i}", model="served", metadata={"i": str(i)})))
            expected[custom_id] = "ok"
    source = tmp_path / "batch.jsonl"
    source.write_text("\n".join(lines) + "\n")
    service = start_service(
        least_privilege(redis_url),
        tmp_path / "data",
        tmp_path / "serve.log",
        "--trim-results",
        "--sample-s",
        "1",
    )
    client = service.client()
    try:
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        assert (uploaded.purpose, uploaded.bytes, uploaded.filename) == (
            "batch",
            source.stat().st_size,
            "batch.jsonl",
        )
        assert client.files.retrieve(uploaded.id).id == uploaded.id
        assert client.files.content(uploaded.id).content == source.read_bytes()
        # no worker runs yet: nobody announces a model, so the batch is taken as it is
        assert client.models.list().data == []
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h", metadata={"run": "t1"}
        )
        assert batch.status == "validating" and batch.request_counts is not None
        assert batch.request_counts.total == 200 and batch.metadata == {"run": "t1"}
        start_worker(redis_url, "w1", tmp_path / "w1.log", "--served-model-name", "served")
        done = wait_final(client, batch.id, service.log)
        assert [model.id for model in client.models.list().data] == ["served"]
        assert [b.id for b in client.batches.list()] == [batch.id]
        output, errors = rows(client, done.output_file_id), rows(client, done.error_file_id)
        # --trim-results: with no batch left running, the results leave Redis (they are in the files)
        queue = redis.Redis.from_url(redis_url)
        wait_until(lambda: queue.xlen(KEYS.results) == 0, "the results stream to be trimmed", service.log)
        assert queue.hget(KEYS.meta, META_RESULTS_TRIMMED) is not None
    finally:
        stop(service.proc)
    assert done.status == "completed", done
    Batch.model_validate(done.model_dump(), strict=True)
    check_every_row_once(output, errors, list(expected))
    assert {row["custom_id"] for row in output} == {c for c, kind in expected.items() if kind == "ok"}
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(output), len(errors))
    for row in output:
        body = ChatCompletion.model_validate(row["response"]["body"], strict=True)
        # the fake worker answers with the text of the job id the service gave the request
        assert body.choices[0].message.content == fake_text(f"{done.id}/{row['custom_id']}")
        assert body.model == "served" and row["response"]["status_code"] == 200 and row["error"] is None
        assert row["response"]["body"]["metadata"] == {"i": str(int(row["custom_id"][4:]))}
    for row in errors:
        assert row["response"] is None and row["error"]["code"] == expected[row["custom_id"]], row
        assert done.id not in row["error"]["message"]  # the service's job ids do not leak


def test_cancel_mid_batch_keeps_what_finished(redis_url: str, tmp_path: Path) -> None:
    """Cancel while a slow worker runs the batch: cancelling, then cancelled; the finished rows are
    in the output file as they were, every other row is a batch_cancelled error, none twice."""
    source = tmp_path / "batch.jsonl"
    ids = write_batch(source, 120)
    service = start_service(least_privilege(redis_url), tmp_path / "data", tmp_path / "serve.log")
    client = service.client()
    start_worker(redis_url, "slow", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.1", RADIXQ_FAKE_CAPACITY="2")
    try:
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
        wait_counts(client, batch.id, 10, service.log)
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        done = wait_final(client, batch.id, service.log)
        output, errors = rows(client, done.output_file_id), rows(client, done.error_file_id)
        again = client.batches.cancel(batch.id)  # idempotent: still the cancelled batch
    finally:
        stop(service.proc)
    assert done.status == "cancelled" and again.status == "cancelled"
    check_every_row_once(output, errors, ids)
    assert len(output) >= 10 and errors, (len(output), len(errors))
    assert {row["error"]["code"] for row in errors} == {"batch_cancelled"}
    for row in output:
        body = ChatCompletion.model_validate(row["response"]["body"], strict=True)
        assert body.choices[0].message.content == fake_text(f"{done.id}/{row['custom_id']}")


def test_the_completion_window_passing_expires_the_batch(redis_url: str, tmp_path: Path) -> None:
    """A window of 3 s (--completion-window-s) and a worker that cannot finish in it: expired, the
    finished rows kept, the others batch_expired errors."""
    source = tmp_path / "batch.jsonl"
    ids = write_batch(source, 80)
    service = start_service(
        least_privilege(redis_url), tmp_path / "data", tmp_path / "serve.log", "--completion-window-s", "3"
    )
    client = service.client()
    start_worker(redis_url, "slow", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.2", RADIXQ_FAKE_CAPACITY="2")
    try:
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        # the window starts at create: the worker is up first (it announces its model)
        wait_until(lambda: client.models.list().data, "the worker's heartbeat", service.log)
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
        assert batch.expires_at is not None and batch.expires_at - batch.created_at == 3
        done = wait_final(client, batch.id, service.log)
        output, errors = rows(client, done.output_file_id), rows(client, done.error_file_id)
    finally:
        stop(service.proc)
    assert done.status == "expired" and done.expired_at is not None, done
    check_every_row_once(output, errors, ids)
    assert output and errors and {row["error"]["code"] for row in errors} == {"batch_expired"}


def test_file_bytes_on_an_object_store(redis_url: str, tmp_path: Path, s3: dict[str, str]) -> None:  # noqa: F811
    """--files-url s3://...: the upload, the input the batch reads and its output file are
    objects in the bucket (moto's S3 server on loopback), read back through the API."""
    source = tmp_path / "batch.jsonl"
    ids = write_batch(source, 5)
    env = {k: v for k, v in s3.items() if not k.startswith("_")}
    service = start_service(
        least_privilege(redis_url),
        tmp_path / "data",
        tmp_path / "serve.log",
        "--files-url",
        "s3://results/serve",
        env=env,
    )
    client = service.client()
    start_worker(redis_url, "w", tmp_path / "w.log")
    try:
        uploaded = client.files.create(file=source.open("rb"), purpose="batch")
        assert s3_text(s3, f"serve/{uploaded.id}.jsonl") == source.read_text()
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
        done = wait_final(client, batch.id, service.log)
        output = rows(client, done.output_file_id)
    finally:
        stop(service.proc)
    assert done.status == "completed" and [row["custom_id"] for row in output] == ids
    stored = s3_text(s3, f"serve/{done.output_file_id}.jsonl").splitlines()
    assert [json.loads(line)["custom_id"] for line in stored] == ids
    assert not (tmp_path / "data" / "files").exists()  # nothing of the files on the local disk
