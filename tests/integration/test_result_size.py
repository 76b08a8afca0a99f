"""A result too large for Redis is its job's error, never a batch retried for ever.

A real redis-server drops the connection on a value over ``proto-max-bulk-len`` (512 MB by
default, set to its 1 MB minimum here, with the outbox's limit lowered to match); redis-py
reports that as a ConnectionError, which the worker treats as transient. Oracle: the results
stream read back with redis-py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from wire.keys import FIELD_RESULT, QueueKeys
from wire.schema import Choice, Result, decode_result
from worker.queue import outbox as outbox_module
from worker.queue.jobqueue import Completion, Write
from worker.queue.outbox import Outbox
from worker.queue.streams import RedisJobQueue

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


@pytest.fixture
def small_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    old = client.config_get("proto-max-bulk-len")["proto-max-bulk-len"]
    client.config_set("proto-max-bulk-len", str(1 << 20))
    yield client
    client.config_set("proto-max-bulk-len", old)
    client.close()


def _result(job_id: str, chars: int) -> Result:
    choice = Choice(index=0, text="x" * chars, token_ids=[1] * 8, finish_reason="length")
    return Result(id=job_id, choices=[choice])


def _written(client: redis.Redis) -> dict[str, Result]:
    entries = client.xrange(KEYS.results)
    return {r.id: r for r in (decode_result(fields[FIELD_RESULT.encode()]) for _, fields in entries)}


def test_an_oversized_result_is_its_jobs_error_and_the_others_land(
    small_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "MAX_RESULT_BYTES", 512 << 10, raising=False)
    queue = RedisJobQueue(small_redis, KEYS.queue, "w1", 60_000, 600_000)
    queue.prepare()
    outbox = Outbox()
    for index, job_id in enumerate(["a", "huge", "b"]):
        outbox.add(Completion(_result(job_id, 2 << 20 if job_id == "huge" else 100), f"{index + 1}-0"))
    assert outbox.flush(queue) == 3
    found = _written(small_redis)
    assert found["a"].ok and found["b"].ok and found["a"].choices[0].text == "x" * 100
    error = found["huge"].error
    assert error is not None and error.code == "result_too_large"
    assert "bytes, over the limit of 524288 bytes" in error.message
    assert small_redis.hget(KEYS.done, "huge") is not None
    assert small_redis.hget(KEYS.failed, "huge") == b"result_too_large"


class _Counting:
    """A JobQueue stand-in that records the bytes of each transaction."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def complete(self, writes: list[Write], acks: list[str]) -> list[Write]:
        self.batches.append([len(w.data) for w in writes])
        return []


def test_a_flush_writes_at_most_max_batch_bytes_per_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Results of 300 KB with a 1 MB batch limit go three to a transaction; one result over the
    batch limit (but under the result limit) goes alone."""
    monkeypatch.setattr(outbox_module, "MAX_BATCH_BYTES", 1 << 20, raising=False)
    outbox = Outbox()
    sizes = [300_000] * 7 + [1_500_000, 300_000]
    for index, chars in enumerate(sizes):
        outbox.add(Completion(_result(f"j{index}", chars), f"{index + 1}-0"))
    queue = _Counting()
    assert outbox.flush(queue) == len(sizes)  # type: ignore[arg-type]
    counts = [len(batch) for batch in queue.batches]
    assert counts == [3, 3, 1, 1, 1]
    assert all(sum(batch) <= 1 << 20 or len(batch) == 1 for batch in queue.batches)
