"""The enqueue script (producer.insert) and its batches (producer.batch) against fakeredis's
Lua: a retry after a lost reply, a queue lost between batches, an id twice in one batch,
batches cut by size. The oracle is what the test enqueued, read back from Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from producer import batch as batch_module
from producer.client import Client, EnqueueStopped
from producer.insert import QueueLost
from tests.jobs_stream import job_entries, newest_entries
from wire.keys import QueueKeys
from wire.schema import Job, decode_job

KEYS = QueueKeys()


def jobs(count: int, prefix: str = "j", prompt: str = "p") -> list[Job]:
    return [Job(id=f"{prefix}{i}", prompt=f"{prompt} {i}") for i in range(count)]


def entry_ids(client: Any) -> list[str]:
    """The id of every job entry, partition by partition."""
    return [fields[b"id"].decode() for _, fields in job_entries(client)]


def order(client: Any) -> list[str]:
    return [item.decode() for item in client.lrange(KEYS.order, 0, -1)]


class LoseFirstReply:
    """The script runs, then the connection drops before its reply arrives (once)."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.lost = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        reply = self.script(*args, **kwargs)
        if not self.lost:
            self.lost += 1
            raise redis.ConnectionError("connection reset by peer (after the script ran)")
        return reply


def test_a_retry_after_a_lost_reply_reports_what_the_first_try_did(fake_redis: fakeredis.FakeRedis) -> None:
    client = Client(fake_redis)
    client.enqueue(jobs(2))
    lossy = LoseFirstReply(client.insert.script)
    client.insert.script = lossy
    report = client.enqueue(jobs(5), batch_size=10)
    assert lossy.lost == 1
    # written once, by the first try; the retry learns it from the batch's record
    assert (report.enqueued, report.skipped) == (["j2", "j3", "j4"], ["j0", "j1"])
    assert sorted(entry_ids(fake_redis)) == order(fake_redis) == [f"j{i}" for i in range(5)]


def test_a_rerun_whose_reply_was_lost_is_still_a_rerun(fake_redis: fakeredis.FakeRedis) -> None:
    client = Client(fake_redis)
    client.enqueue(jobs(2))
    fake_redis.hset(KEYS.done, "j0", "1-0")  # j0 ran
    client.insert.script = LoseFirstReply(client.insert.script)
    report = client.enqueue(jobs(2, prompt="edited"), rerun_changed=True)
    assert (report.rerun, report.changed) == (["j0"], ["j1"])  # j1 is not done: kept
    assert fake_redis.hget(KEYS.done, "j0") is None
    prompts = [decode_job(f[b"job"]).prompt for _, f in job_entries(fake_redis) if f[b"id"] == b"j0"]
    assert sorted(prompts) == ["edited 0", "p 0"]  # the new entry written once


def test_a_queue_lost_between_batches_stops_the_enqueue_writing_nothing_more(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    def rows() -> Iterator[Job]:
        yield from jobs(3)
        fake_redis.flushall()  # Redis restarted without its data while the next batch was read
        yield from jobs(3, prefix="k")

    with pytest.raises(EnqueueStopped) as stopped:
        Client(fake_redis).enqueue(rows(), batch_size=3)
    assert isinstance(stopped.value.cause, QueueLost)
    assert "lost this queue's data while it was being enqueued" in str(stopped.value.cause)
    assert stopped.value.report.enqueued == ["j0", "j1", "j2"]  # they went in, and were lost with it
    assert fake_redis.dbsize() == 0  # nothing of the batch after the loss


def test_an_id_twice_in_one_batch_goes_in_once(fake_redis: fakeredis.FakeRedis) -> None:
    same, other = Job(id="a", prompt="one"), Job(id="a", prompt="two")
    report = Client(fake_redis).enqueue([same, same, Job(id="b", prompt="x"), other])
    assert (report.enqueued, report.skipped, report.changed) == (["a", "b"], ["a"], ["a"])
    assert sorted(entry_ids(fake_redis)) == ["a", "b"] and order(fake_redis) == ["a", "b"]


def test_batches_are_cut_by_size_and_keep_the_order(
    fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_module, "MAX_BATCH_BYTES", 400)  # a few jobs a script
    calls = []
    client = Client(fake_redis)
    script = client.insert.script
    client.insert.script = lambda *a, **k: calls.append(1) or script(*a, **k)
    ids = [job.id for job in jobs(40)]
    report = client.enqueue(jobs(40), batch_size=40)
    assert report.enqueued == ids and order(fake_redis) == ids
    assert sorted(newest_entries(fake_redis)) == sorted(ids) and len(entry_ids(fake_redis)) == 40
    assert len(calls) > 5
