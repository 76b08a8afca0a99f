"""Client (enqueue, status) and Collector against fakeredis."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis

from producer.client import Client
from producer.collector import Collector
from tests.jobs_stream import job_entries, newest_entries, total_len
from wire.keys import FIELD_ENTRY, FIELD_ID, FIELD_RESULT, QueueKeys
from wire.schema import Choice, Job, Result, decode_job, encode, error_result
from wire.status import Heartbeat, is_alive

KEYS = QueueKeys()


def jobs(count: int) -> list[Job]:
    return [Job(id=f"j{i}", prompt=f"p{i}") for i in range(count)]


def complete(client: fakeredis.FakeRedis, job_id: str, text: str, *, counted: bool = True) -> None:
    """Write a result the way a worker does (entry id from the jobs stream)."""
    entry = newest_entries(client)[job_id]
    result = Result(id=job_id, choices=[Choice(index=0, text=text, token_ids=[], finish_reason="stop")])
    client.xadd(
        KEYS.results,
        {FIELD_ID: job_id, FIELD_ENTRY: entry if counted else b"0-1", FIELD_RESULT: encode(result)},
    )
    if counted:
        client.hsetnx(KEYS.done, job_id, entry)


def test_enqueue_is_idempotent_by_id(fake_redis: fakeredis.FakeRedis) -> None:
    client = Client(fake_redis)
    first = client.enqueue(jobs(5), batch_size=2)
    assert first.enqueued == [f"j{i}" for i in range(5)] and first.skipped == []
    second = client.enqueue(jobs(7), batch_size=3)
    assert second.enqueued == ["j5", "j6"] and second.skipped == [f"j{i}" for i in range(5)]
    assert total_len(fake_redis) == 7
    assert client.order() == [f"j{i}" for i in range(7)]
    stored = [decode_job(fields[b"job"]) for _, fields in job_entries(fake_redis)]
    assert all(job.enqueued_at_ms > 0 for job in stored)
    status = client.status()
    assert (status.enqueued, status.queued, status.in_flight, status.done) == (7, 7, 0, 0)


def test_collect_orders_dedupes_and_ignores_uncounted(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    Client(fake_redis).enqueue(jobs(4))
    for job_id in ["j3", "j1", "j0"]:
        complete(fake_redis, job_id, f"text {job_id}")
    complete(fake_redis, "j1", "duplicate", counted=True)  # a second result for a done job
    complete(fake_redis, "j2", "stale", counted=False)  # a result the done hash does not name
    out = tmp_path / "out.jsonl"
    partial = Collector(fake_redis).collect(out, wait=False)
    assert (partial.missing, partial.held) == (["j2"], ["j3"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # In order up to the first gap; what arrived behind it waits in the spill.
    assert [(row["id"], row["choices"][0]["text"]) for row in rows] == [("j0", "text j0"), ("j1", "text j1")]
    assert partial.spill == tmp_path / "out.jsonl.spill" and partial.spill.exists()
    complete(fake_redis, "j2", "text j2")
    resumed = Collector(fake_redis).collect(out, wait=True, timeout_s=5)
    assert (resumed.already, resumed.written, resumed.missing, resumed.held) == (2, 2, [], [])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(row["id"], row["choices"][0]["text"]) for row in rows] == [
        ("j0", "text j0"),
        ("j1", "text j1"),
        ("j2", "text j2"),
        ("j3", "text j3"),
    ]
    assert not partial.spill.exists()


def test_collect_includes_error_rows_and_unlisted_ids(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    Client(fake_redis).enqueue(jobs(1))
    complete(fake_redis, "j0", "ok")
    fake_redis.xadd(
        KEYS.results,
        {
            FIELD_ID: "raw",
            FIELD_ENTRY: b"5-0",
            FIELD_RESULT: encode(error_result("raw", "invalid_job", "bad")),
        },
    )
    fake_redis.hset(KEYS.done, "raw", b"5-0")
    out = tmp_path / "out.jsonl"
    report = Collector(fake_redis).collect(out, wait=True, timeout_s=5)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert report.written == 2
    assert [row["id"] for row in rows] == ["j0", "raw"]
    assert rows[1]["error"] == {"code": "invalid_job", "message": "bad"}


def test_collect_times_out_with_missing_ids(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    Client(fake_redis).enqueue(jobs(2))
    complete(fake_redis, "j1", "x")
    report = Collector(fake_redis).collect(
        tmp_path / "o.jsonl", ids=["j0", "j1"], wait=True, timeout_s=0.3, poll_s=0.05
    )
    assert (report.missing, report.held, report.written) == (["j0"], ["j1"], 0)


def test_consumer_liveness_rule() -> None:
    now = 1_000_000
    fresh = Heartbeat(name="w", pid=1, last_seen_ms=now - 1_000, interval_s=2.0)
    stale = Heartbeat(name="w", pid=1, last_seen_ms=now - 42_000, interval_s=2.0)
    assert is_alive(fresh, idle_ms=30_000, at_ms=now) == (True, 1.0)  # beats while busy with long jobs
    assert is_alive(stale, idle_ms=500, at_ms=now) == (True, 42.0)  # reads, but cannot write its heartbeat
    assert is_alive(stale, idle_ms=10_001, at_ms=now) == (False, 42.0)  # 5 intervals of silence
    assert is_alive(None, idle_ms=59_000, at_ms=now) == (True, None)
    assert is_alive(None, idle_ms=60_000, at_ms=now) == (False, None)


def test_enqueue_and_requeue_write_the_epoch_once(fake_redis: fakeredis.FakeRedis) -> None:
    client = Client(fake_redis)
    client.enqueue(jobs(2))
    epoch = fake_redis.hget(KEYS.meta, "epoch")
    assert epoch is not None and len(epoch) == 16
    client.enqueue(jobs(3))
    assert client.requeue_dead() == []
    assert fake_redis.hget(KEYS.meta, "epoch") == epoch
