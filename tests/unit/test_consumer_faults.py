"""The consumer keeps a failure to the entry or job that caused it (fakeredis, fake backend)."""

from __future__ import annotations

import logging
import time

import fakeredis
import msgspec
import pytest

from producer.client import Client
from producer.keys import FIELD_ID, FIELD_JOB, QueueKeys
from producer.schema import Job, Result, encode_job
from producer.status import decode_heartbeat
from tests.fake_backend import FakeBackend
from tests.unit.test_consumer import consumer_for, make_jobs, results_by_id, step_until
from worker.queue.backend import ENGINE_CRASH
from worker.queue.outbox import Completion, Outbox

KEYS = QueueKeys()


def test_unusable_entries_get_their_own_error_and_the_rest_complete(fake_redis: fakeredis.FakeRedis) -> None:
    good = make_jobs(3)
    Client(fake_redis).enqueue(good[:2])
    job_bytes = encode_job(good[2])
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: b"bad\xff\xfe", FIELD_JOB: job_bytes})  # id not UTF-8
    fake_redis.xadd(KEYS.jobs, {FIELD_JOB: job_bytes})  # no id field
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: "other", FIELD_JOB: job_bytes})  # payload says j2
    missing_id_entry = fake_redis.xrange(KEYS.jobs)[-2][0].decode()
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: "j2", FIELD_JOB: job_bytes})
    consumer = consumer_for(fake_redis, FakeBackend())
    step_until([consumer], 6, fake_redis)
    found = results_by_id(fake_redis)
    assert all(found[job.id][0].ok for job in good)
    not_utf8 = found["bad\\xff\\xfe"][0].error
    assert not_utf8 is not None and not_utf8.code == "invalid_job" and "not UTF-8" in not_utf8.message
    no_id = found[missing_id_entry][0].error
    assert no_id is not None and "has no 'id' field" in no_id.message
    mismatch = found["other"][0].error
    assert mismatch is not None and "differs from the stream entry's id field 'other'" in mismatch.message
    assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] == 0


def test_a_surprise_while_taking_one_entry_in_fails_that_entry_only(
    fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.queue.consumer as consumer_module

    real = consumer_module.decode_entry

    def exploding(entry):  # type: ignore[no-untyped-def]
        if entry.job_id == "j1":
            raise RuntimeError("boom")
        return real(entry)

    monkeypatch.setattr(consumer_module, "decode_entry", exploding)
    Client(fake_redis).enqueue(make_jobs(4))
    consumer = consumer_for(fake_redis, FakeBackend())
    step_until([consumer], 4, fake_redis)
    found = results_by_id(fake_redis)
    error = found["j1"][0].error
    assert error is not None and error.code == "internal" and "RuntimeError: boom" in error.message
    assert all(found[f"j{i}"][0].ok for i in (0, 2, 3))


def test_a_result_that_cannot_be_encoded_becomes_an_internal_error(fake_redis: fakeredis.FakeRedis) -> None:
    outbox = Outbox(KEYS)
    bad = Result(id="big", metadata={"n": 2**70})  # msgpack has no such integer
    outbox.add(Completion(bad, "1-0"))
    outbox.add(Completion(Result(id="fine", metadata={"n": 1}), "2-0"))
    assert outbox.flush(fake_redis) == 2
    found = results_by_id(fake_redis)
    assert found["big"][0].error is not None and found["big"][0].error.code == "internal"
    assert "could not be encoded" in found["big"][0].error.message
    assert found["fine"][0].metadata == {"n": 1}


def test_engine_crash_counts_attempts_then_dead_letters_the_culprit(fake_redis: fakeredis.FakeRedis) -> None:
    poison = Job(id="poison", prompt="x", metadata={"fake_error": ENGINE_CRASH})
    Client(fake_redis).enqueue([*make_jobs(3), poison])
    backend = FakeBackend()
    consumer = consumer_for(fake_redis, backend, max_attempts=3)
    step_until([consumer], 4, fake_redis)
    assert backend.submitted.count("poison") == 3  # run, then twice more (attempts 2 and 3)
    (letter,) = Client(fake_redis).dead_letters()
    assert letter.job_id == "poison" and letter.attempts == 4
    assert "crashed the engine 3 times when it ran alone (max_attempts=3)" in letter.reason
    found = results_by_id(fake_redis)
    assert [r.error.code for r in found["poison"] if r.error] == ["dead_letter"]
    assert all(found[f"j{i}"][0].ok for i in range(3))
    # the delivery count in Redis says the same as the dead letter
    assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] == 0


def test_read_window_caps_what_one_worker_holds(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(20))
    backend = FakeBackend(capacity=64, latency_s=0.01)
    consumer = consumer_for(fake_redis, backend, read_window=3)
    deadline = time.monotonic() + 20
    while fake_redis.hlen(KEYS.done) < 20:
        assert time.monotonic() < deadline
        consumer.step()
        assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] <= 3
    assert backend.max_held == 3


def test_acknowledged_entries_are_trimmed(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(30))
    consumer = consumer_for(fake_redis, FakeBackend(), housekeeping_s=0.0)
    step_until([consumer], 30, fake_redis)
    consumer.step()
    assert fake_redis.xlen(KEYS.jobs) == 0
    assert fake_redis.hlen(KEYS.done) == 30 and fake_redis.llen(KEYS.order) == 30  # bookkeeping stays


def test_keep_jobs_keeps_them(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(5))
    consumer = consumer_for(fake_redis, FakeBackend(), housekeeping_s=0.0, trim_jobs=False)
    step_until([consumer], 5, fake_redis)
    consumer.step()
    assert fake_redis.xlen(KEYS.jobs) == 5


def test_dead_consumers_holding_nothing_are_forgotten(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(4))
    fake_redis.xreadgroup(KEYS.group, "holder", {KEYS.jobs: ">"}, count=1)  # dies holding j0
    fake_redis.xreadgroup(KEYS.group, "quitter", {KEYS.jobs: ">"}, count=1)  # dies after acking j1
    (entry,) = [
        e
        for e in fake_redis.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 10)
        if e["consumer"] == b"quitter"
    ]
    fake_redis.xack(KEYS.jobs, KEYS.group, entry["message_id"])
    fake_redis.hset(
        KEYS.workers, "gone", msgspec.msgpack.encode({"name": "gone", "pid": 1, "last_seen_ms": 1})
    )
    time.sleep(0.25)
    consumer = consumer_for(fake_redis, FakeBackend(), min_idle_s=60, heartbeat_s=0.01, housekeeping_s=0.0)
    consumer.janitor.dead_after_ms = 200
    consumer.step()
    names = {c["name"].decode() for c in fake_redis.xinfo_consumers(KEYS.jobs, KEYS.group)}
    assert "quitter" not in names and "holder" in names  # never one that holds entries
    assert fake_redis.hget(KEYS.workers, "gone") is None
    assert decode_heartbeat(fake_redis.hget(KEYS.workers, "c1") or b"") is not None  # not itself


def test_redis_losing_the_queue_is_reported(
    fake_redis: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    client = Client(fake_redis)
    client.enqueue(make_jobs(2))
    consumer = consumer_for(fake_redis, FakeBackend(), heartbeat_s=0.0)
    step_until([consumer], 2, fake_redis)
    assert consumer.data_losses == 0
    fake_redis.flushall()  # what a restart without persistence looks like
    with caplog.at_level(logging.ERROR, logger="radixq.worker"):
        for _ in range(3):
            consumer.guarded(consumer.step)
    assert consumer.data_losses == 1
    assert "DATA LOSS" in caplog.text and "Re-enqueue the input file" in caplog.text
    client.enqueue(make_jobs(2, prefix="k"))  # a new epoch: no second report
    step_until([consumer], 2, fake_redis)
    assert consumer.data_losses == 1
