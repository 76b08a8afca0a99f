"""The Python face of a queue: enqueue jobs, read status, manage dead letters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import redis

from producer.keys import DEFAULT_QUEUE, FIELD_ATTEMPTS, FIELD_ID, FIELD_JOB, FIELD_REASON, QueueKeys
from producer.schema import Job, encode_job
from producer.status import QueueStatus, now_ms, read_status


@dataclass(frozen=True)
class EnqueueReport:
    enqueued: list[str]
    skipped: list[str]  # already enqueued earlier (idempotent by job id)


@dataclass(frozen=True)
class DeadLetter:
    entry_id: str  # in the dead-letter stream
    job_id: str
    reason: str
    attempts: int
    job: bytes


def connect(url: str) -> redis.Redis:
    """A client with the timeouts radixq expects (bytes replies, health checks)."""
    return redis.Redis.from_url(
        url, socket_connect_timeout=5, socket_keepalive=True, health_check_interval=30
    )


def ensure_group(client: redis.Redis, keys: QueueKeys) -> None:
    """Create the jobs stream and its consumer group (reading from the start) if missing."""
    try:
        client.xgroup_create(keys.jobs, keys.group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def read_order(client: redis.Redis, keys: QueueKeys) -> list[str]:
    """Every enqueued job id, in enqueue order."""
    items: Any = client.lrange(keys.order, 0, -1)
    return [item.decode() for item in items]


class Client:
    """A handle on one named queue.

    ``enqueue`` is idempotent by job id: a job whose id was enqueued before is skipped, so
    enqueueing the same file twice creates no duplicate work.
    """

    def __init__(self, client: redis.Redis, queue: str = DEFAULT_QUEUE) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)

    @classmethod
    def from_url(cls, url: str, queue: str = DEFAULT_QUEUE) -> Client:
        return cls(connect(url), queue)

    def close(self) -> None:
        self.redis.close()

    def enqueue(self, jobs: Iterable[Job], batch_size: int = 1000) -> EnqueueReport:
        ensure_group(self.redis, self.keys)
        enqueued: list[str] = []
        skipped: list[str] = []
        batch: list[Job] = []
        for job in jobs:
            batch.append(job)
            if len(batch) == batch_size:
                self._enqueue_batch(batch, enqueued, skipped)
                batch = []
        if batch:
            self._enqueue_batch(batch, enqueued, skipped)
        return EnqueueReport(enqueued, skipped)

    def _enqueue_batch(self, jobs: list[Job], enqueued: list[str], skipped: list[str]) -> None:
        # WATCH the id hash so that two producers racing on the same ids cannot both add them:
        # the check and the XADDs commit together or retry.
        keys = self.keys
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(keys.enqueued)
                    seen = pipe.hmget(keys.enqueued, [job.id for job in jobs])
                    new = [job for job, mark in zip(jobs, seen, strict=True) if mark is None]
                    enqueued_at_ms = now_ms()
                    pipe.multi()
                    for job in new:
                        data = encode_job(msgspec.structs.replace(job, enqueued_at_ms=enqueued_at_ms))
                        pipe.xadd(keys.jobs, {FIELD_ID: job.id, FIELD_JOB: data})
                    if new:
                        pipe.hset(keys.enqueued, mapping={job.id: enqueued_at_ms for job in new})
                        pipe.rpush(keys.order, *[job.id for job in new])
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
        enqueued.extend(job.id for job in new)
        skipped.extend(job.id for job, mark in zip(jobs, seen, strict=True) if mark is not None)

    def order(self) -> list[str]:
        """All job ids in enqueue order."""
        return read_order(self.redis, self.keys)

    def status(self) -> QueueStatus:
        return read_status(self.redis, self.keys)

    def dead_letters(self, count: int = 1000) -> list[DeadLetter]:
        entries: Any = self.redis.xrange(self.keys.dead, count=count)
        return [
            DeadLetter(
                entry_id=entry_id.decode(),
                job_id=fields[FIELD_ID.encode()].decode(),
                reason=fields.get(FIELD_REASON.encode(), b"").decode(),
                attempts=int(fields.get(FIELD_ATTEMPTS.encode(), b"0")),
                job=fields[FIELD_JOB.encode()],
            )
            for entry_id, fields in entries
        ]

    def requeue_dead(self, job_ids: Iterable[str] | None = None) -> list[str]:
        """Put dead letters back on the jobs stream (all, or those with the given ids).

        Each one gets a fresh delivery count; its dead_letter result stops counting (the
        ``done`` mark is removed), so collect waits for the new run's result.
        """
        wanted = set(job_ids) if job_ids is not None else None
        requeued: list[str] = []
        ensure_group(self.redis, self.keys)
        keys = self.keys
        for letter in self.dead_letters(count=1 << 30):
            if wanted is not None and letter.job_id not in wanted:
                continue
            with self.redis.pipeline(transaction=True) as pipe:
                pipe.xadd(keys.jobs, {FIELD_ID: letter.job_id, FIELD_JOB: letter.job})
                pipe.hdel(keys.done, letter.job_id)
                pipe.hdel(keys.failed, letter.job_id)
                pipe.xdel(keys.dead, letter.entry_id)
                pipe.execute()
            requeued.append(letter.job_id)
        return requeued
