"""The consumer on the Redis Streams queue (fakeredis): what only Redis has - raw stream
entries anyone can write, consumers that die holding entries, trimming, forgetting. Tests that
write or read the jobs stream by hand enqueue with ``partitions=0`` (one stream, no routing)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import fakeredis
import msgspec
import pytest

from producer.client import Client
from producer.collector import Collector
from tests.fake_generator import FakeGenerator
from tests.jobs_stream import pending_count, total_len
from tests.unit.queue_worlds import RedisWorld, config_for
from tests.unit.test_consumer import make_jobs
from tests.waiting import LIVENESS_S, drive_until
from wire.keys import FIELD_ID, FIELD_JOB, QueueKeys
from wire.schema import Result, decode_result, encode_job
from wire.status import decode_heartbeat
from worker.queue.consumer import Consumer
from worker.queue.streams import RedisJobQueue

KEYS = QueueKeys()


def consumer_for(
    client: fakeredis.FakeRedis, generator: FakeGenerator, name: str = "c1", **settings: Any
) -> Consumer:
    config = config_for(name, **settings)
    return Consumer(
        RedisJobQueue(client, KEYS.queue, name, config.min_idle_ms, config.dead_after_ms), generator, config
    )


def step_until(
    consumers: list[Consumer], done: int, client: fakeredis.FakeRedis, timeout_s: float = LIVENESS_S
) -> None:
    drive_until(
        lambda: client.hlen(KEYS.done) >= done,
        lambda: [consumer.guarded(consumer.step) for consumer in consumers],
        lambda: f"{done} done (only {client.hlen(KEYS.done)})",
        timeout_s=timeout_s,
    )


def results_by_id(client: fakeredis.FakeRedis) -> dict[str, list[Result]]:
    found: dict[str, list[Result]] = {}
    for _, fields in client.xrange(KEYS.results):
        result = decode_result(fields[b"result"])
        found.setdefault(result.id, []).append(result)
    return found


def test_unusable_entries_get_their_own_error_and_the_rest_complete(fake_redis: fakeredis.FakeRedis) -> None:
    good = make_jobs(3)
    Client(fake_redis, partitions=0).enqueue(good[:2])
    job_bytes = encode_job(good[2])
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: b"bad\xff\xfe", FIELD_JOB: job_bytes})  # id not UTF-8
    fake_redis.xadd(KEYS.jobs, {FIELD_JOB: job_bytes})  # no id field
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: "other", FIELD_JOB: job_bytes})  # payload says j2
    missing_id_entry = fake_redis.xrange(KEYS.jobs)[-2][0].decode()
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: "j2", FIELD_JOB: job_bytes})
    consumer = consumer_for(fake_redis, FakeGenerator())
    step_until([consumer], 6, fake_redis)
    found = results_by_id(fake_redis)
    assert all(found[job.id][0].ok for job in good)
    not_utf8 = found["bad\\xff\\xfe"][0].error
    assert not_utf8 is not None and not_utf8.code == "invalid_job" and "not UTF-8" in not_utf8.message
    no_id = found[missing_id_entry][0].error
    assert no_id is not None and "has no 'id' field" in no_id.message
    mismatch = found["other"][0].error
    assert mismatch is not None and "differs from the stream entry's id field 'other'" in mismatch.message
    assert pending_count(fake_redis) == 0


def test_dead_consumer_jobs_are_reclaimed_then_dead_lettered_and_requeued(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    client = Client(fake_redis, partitions=0)
    client.enqueue(make_jobs(3))
    # A consumer that reads and dies: delivery 1 of every job.
    fake_redis.xreadgroup(KEYS.group, "ghost", {KEYS.jobs: ">"}, count=10)
    time.sleep(0.06)  # simulated latency: the entries idle past 50 ms
    # A second one reclaims and dies too: delivery 2.
    fake_redis.xautoclaim(KEYS.jobs, KEYS.group, "ghost2", 50, "0-0", count=10)
    time.sleep(0.06)  # simulated latency: the entries idle past 50 ms again
    consumer = consumer_for(fake_redis, FakeGenerator(), min_idle_s=0.05, max_attempts=2)
    step_until([consumer], 3, fake_redis)
    assert fake_redis.xlen(KEYS.dead) == 3
    letters = client.dead_letters()
    assert sorted(letter.job_id for letter in letters) == ["j0", "j1", "j2"]
    assert all(
        letter.attempts == 3 and "delivered 3 times (max_attempts=2)" in letter.reason for letter in letters
    )
    status = client.status()
    assert (status.done, status.failed, status.dead_lettered, status.in_flight) == (3, 3, 3, 0)

    out = tmp_path / "out.jsonl"
    first = Collector(fake_redis).collect(out, wait=False)
    assert first.written == 3 and first.missing == []
    assert all('"dead_letter"' in line for line in out.read_text().splitlines())

    # Requeued, they run for real; a fresh collect counts the new results, not the dead letters.
    assert sorted(client.requeue_dead(["j0", "j2"])) == ["j0", "j2"]
    assert fake_redis.xlen(KEYS.dead) == 1
    step_until([consumer], 3, fake_redis)
    out2 = tmp_path / "out2.jsonl"
    Collector(fake_redis).collect(out2, wait=True, timeout_s=5)
    rows = {row["id"]: row for row in map(msgspec.json.decode, out2.read_text().splitlines())}
    assert rows["j0"]["error"] is None and rows["j2"]["error"] is None
    assert rows["j1"]["error"]["code"] == "dead_letter"


def test_drained_consumer_leaves_the_group(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis, partitions=0).enqueue(make_jobs(3))
    leaving = consumer_for(
        fake_redis, FakeGenerator(capacity=3, latency_s=30), "leaving", drain_timeout_s=0.2
    )
    leaving.step()
    leaving.request_stop()
    leaving.drain()
    assert all(c["name"] != b"leaving" for c in fake_redis.xinfo_consumers(KEYS.jobs, KEYS.group))
    assert fake_redis.hget(KEYS.workers, "leaving") is None
    assert fake_redis.xlen(KEYS.jobs) >= 3  # the three given back as new entries


def test_acknowledged_entries_are_trimmed(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(30))
    consumer = consumer_for(fake_redis, FakeGenerator(), housekeeping_s=0.0)
    step_until([consumer], 30, fake_redis)
    consumer.step()
    assert total_len(fake_redis) == 0
    assert fake_redis.hlen(KEYS.done) == 30 and fake_redis.llen(KEYS.order) == 30  # bookkeeping stays


def test_keep_jobs_keeps_them(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(5))
    consumer = consumer_for(fake_redis, FakeGenerator(), housekeeping_s=0.0, trim_jobs=False)
    step_until([consumer], 5, fake_redis)
    consumer.step()
    assert total_len(fake_redis) == 5


def test_dead_consumers_holding_nothing_are_forgotten(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis, partitions=0).enqueue(make_jobs(4))
    fake_redis.xreadgroup(KEYS.group, "holder", {KEYS.jobs: ">"}, count=1)  # dies holding j0
    fake_redis.xreadgroup(KEYS.group, "quitter", {KEYS.jobs: ">"}, count=1)  # dies after acking j1
    pending = fake_redis.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 10)
    (entry,) = [e for e in pending if e["consumer"] == b"quitter"]
    fake_redis.xack(KEYS.jobs, KEYS.group, entry["message_id"])
    fake_redis.hset(
        KEYS.workers, "gone", msgspec.msgpack.encode({"name": "gone", "pid": 1, "last_seen_ms": 1})
    )
    time.sleep(0.25)  # simulated latency: the consumers idle past dead_after_ms (200)
    consumer = consumer_for(fake_redis, FakeGenerator(), min_idle_s=60, heartbeat_s=0.01, housekeeping_s=0.0)
    consumer.queue.janitor.dead_after_ms = 200  # type: ignore[attr-defined]
    consumer.step()
    names = {c["name"].decode() for c in fake_redis.xinfo_consumers(KEYS.jobs, KEYS.group)}
    assert "quitter" not in names and "holder" in names  # never one that holds entries
    assert fake_redis.hget(KEYS.workers, "gone") is None
    assert decode_heartbeat(fake_redis.hget(KEYS.workers, "c1") or b"") is not None  # not itself


def test_a_corrupt_routing_value_keeps_the_worker_waiting_not_dead(
    fake_redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The queue's meta hash holding a partition count that is not a number (written by hand or
    by another program) is said once, clearly, and waited out like an outage; put right, the
    worker goes on. Before, every worker of the queue died after five tracebacks."""
    Client(fake_redis).enqueue(make_jobs(3))
    partitions = fake_redis.hget(KEYS.meta, "partitions")
    fake_redis.hset(KEYS.meta, "partitions", "three")
    consumer = consumer_for(fake_redis, FakeGenerator(), max_backoff_s=0.05)
    with caplog.at_level(logging.WARNING, logger="radixq.worker"):
        for _ in range(12):
            assert consumer.guarded(consumer.step) is False
    assert "'partitions' is b'three', not an integer" in caplog.text
    assert "Traceback" not in caplog.text
    fake_redis.hset(KEYS.meta, "partitions", partitions or b"1")
    step_until([consumer], 3, fake_redis)
    assert all(results[0].ok for results in results_by_id(fake_redis).values())


def test_an_entry_without_its_job_field_says_so() -> None:
    """An entry XADDed with an id and no job: its invalid_job row says the job is missing
    (msgspec's own words for an empty payload were "Input data was truncated")."""
    world = RedisWorld()
    entry = world.redis.xadd(KEYS.jobs, {FIELD_ID: "nojob"}).decode()
    consumer = world.consumer(FakeGenerator())
    step_until([consumer], 1, world.redis)
    (result,) = world.results_by_id()["nojob"]
    assert result.error is not None and result.error.code == "invalid_job"
    assert result.error.message == (
        f"job 'nojob': job: the stream entry {entry} holds no job (its 'job' field is missing or empty)"
    )
