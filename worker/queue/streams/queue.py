"""RedisJobQueue: the JobQueue contract on a Redis Streams consumer group (keys: producer.keys).

    read         XREADGROUP >                       complete  one MULTI: XADD result, HSETNX done,
    reclaim      XAUTOCLAIM (min idle)                        HSET failed, XADD dead, XACK
    renew        XCLAIM ... JUSTID (own entries)    release   one MULTI: XADD the job again, XACK
    count        a script: XCLAIM (counts a delivery) if still ours
    heartbeat    HSET workers + HGET meta epoch     housekeeping  XTRIM MINID, forget dead consumers

Redis errors leave as the contract's: transient ones (producer.redis_errors) as
QueueUnavailable, a missing group as QueueLost, fatal ones as QueueRefused (one line).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import redis

from producer.client import ensure_group
from producer.keys import (
    FIELD_ATTEMPTS,
    FIELD_ENTRY,
    FIELD_ID,
    FIELD_JOB,
    FIELD_REASON,
    FIELD_RESULT,
    META_EPOCH,
    QueueKeys,
)
from producer.redis_errors import classify, describe, url_of
from producer.status import Heartbeat
from worker.queue.jobqueue import (
    Delivery,
    Entry,
    QueueLost,
    QueueRefused,
    QueueUnavailable,
    Release,
    Write,
    entry_key,
)
from worker.queue.streams.leases import Leases
from worker.queue.streams.retention import ConsumerJanitor, trim_acked_jobs

T = TypeVar("T")


def read_entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
    """An entry as XREADGROUP/XAUTOCLAIM hand it over, whatever its fields hold."""
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    raw_id = fields.get(FIELD_ID.encode())
    data = fields.get(FIELD_JOB.encode(), b"")
    if raw_id is None:
        return Entry(entry_id, entry_id, data, f"entry {entry_id} has no {FIELD_ID!r} field")
    try:
        job_id = raw_id.decode()
    except UnicodeDecodeError:
        shown = raw_id.decode("utf-8", "backslashreplace")
        return Entry(
            entry_id, shown, data, f"the {FIELD_ID!r} field of entry {entry_id} is not UTF-8: {shown!r}"
        )
    if not job_id:
        return Entry(entry_id, entry_id, data, f"entry {entry_id} has an empty {FIELD_ID!r} field")
    return Entry(entry_id, job_id, data)


def _translated(method: Callable[..., T]) -> Callable[..., T]:
    """Redis errors as the JobQueue contract's."""

    @functools.wraps(method)
    def call(self: RedisJobQueue, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except redis.RedisError as exc:
            kind = classify(exc)
            if kind == "fatal":
                raise QueueRefused(describe(exc, self.where)) from None
            if "NOGROUP" in str(exc):
                raise QueueLost(describe(exc, self.where)) from exc
            if kind == "transient":
                raise QueueUnavailable(describe(exc, self.where)) from exc
            raise

    return call


class RedisJobQueue:
    """See worker.queue.jobqueue.JobQueue."""

    def __init__(
        self, client: redis.Redis, queue: str, name: str, min_idle_ms: int, dead_after_ms: int
    ) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)
        self.name = name
        self.where = url_of(client)
        self.leases = Leases(self.keys, name, min_idle_ms)
        self.janitor = ConsumerJanitor(self.keys, name, dead_after_ms)

    @_translated
    def prepare(self) -> None:
        ensure_group(self.redis, self.keys)

    @_translated
    def read(self, count: int, block_s: float | None) -> list[Delivery]:
        block_ms = None if block_s is None else int(block_s * 1000)
        reply: Any = self.redis.xreadgroup(
            self.keys.group, self.name, {self.keys.jobs: ">"}, count=count, block=block_ms
        )
        if not reply:
            return []
        return [Delivery(read_entry(entry_id, fields), 1) for entry_id, fields in reply[0][1]]

    @_translated
    def reclaim(self, count: int) -> list[Delivery]:
        return [
            Delivery(read_entry(c.entry_id, c.fields), c.deliveries)
            for c in self.leases.claim(self.redis, count)
        ]

    @_translated
    def completed(self, job_ids: list[str]) -> list[bool]:
        marks: Any = self.redis.hmget(self.keys.done, job_ids)
        return [mark is not None for mark in marks]

    @_translated
    def complete(self, writes: list[Write], acks: list[str]) -> None:
        keys = self.keys
        with self.redis.pipeline(transaction=True) as pipe:
            for write in writes:
                completion, result = write.completion, write.completion.result
                pipe.xadd(
                    keys.results,
                    {FIELD_ID: result.id, FIELD_ENTRY: completion.entry_id, FIELD_RESULT: write.data},
                )
                pipe.hsetnx(keys.done, result.id, completion.entry_id)
                if result.error is not None:
                    pipe.hset(keys.failed, result.id, result.error.code)
                if completion.dead is not None:
                    dead = completion.dead
                    fields: dict[Any, Any] = {FIELD_ID: result.id, FIELD_ENTRY: completion.entry_id}
                    fields.update(
                        {FIELD_JOB: dead.job, FIELD_REASON: dead.reason, FIELD_ATTEMPTS: dead.attempts}
                    )
                    pipe.xadd(keys.dead, fields)
                pipe.xack(keys.jobs, keys.group, completion.entry_id, *completion.also_ack)
            if acks:
                pipe.xack(keys.jobs, keys.group, *acks)
            pipe.execute()

    @_translated
    def renew(self, entry_ids: list[str]) -> set[str]:
        return self.leases.renew(self.redis, entry_ids)

    @_translated
    def count_attempt(self, entry_id: str) -> int | None:
        return self.leases.count_attempt(self.redis, entry_id)

    @_translated
    def release(self, jobs: list[Release]) -> None:
        # NOTE: given back as new entries (the old ones acknowledged in the same transaction),
        # so other workers get them now instead of after min_idle.
        with self.redis.pipeline(transaction=True) as pipe:
            for job in jobs:
                pipe.xadd(self.keys.jobs, {FIELD_ID: job.job_id, FIELD_JOB: job.data})
                pipe.xack(self.keys.jobs, self.keys.group, *job.entry_ids)
            pipe.execute()

    @_translated
    def leave(self) -> None:
        pending: Any = self.redis.xpending_range(
            self.keys.jobs, self.keys.group, min="-", max="+", count=1, consumername=self.name
        )
        if not pending:
            self.redis.xgroup_delconsumer(self.keys.jobs, self.keys.group, self.name)
        self.redis.hdel(self.keys.workers, self.name)

    @_translated
    def heartbeat(self, beat: Heartbeat) -> str | None:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.workers, self.name, msgspec.msgpack.encode(beat))
            pipe.hget(self.keys.meta, META_EPOCH)
            reply: Any = pipe.execute()
        return reply[1].decode() if reply[1] is not None else None

    @_translated
    def newest_entry(self) -> tuple[int, int]:
        try:
            info: Any = self.redis.xinfo_stream(self.keys.jobs)
        except redis.ResponseError:  # no such key
            return (0, 0)
        return entry_key(info["last-generated-id"].decode())

    @_translated
    def housekeeping(self, trim: bool) -> list[str]:
        if trim:
            trim_acked_jobs(self.redis, self.keys)
        return self.janitor.sweep(self.redis)
