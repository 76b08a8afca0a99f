"""RedisJobQueue: the JobQueue contract on Redis Streams consumer groups (keys: wire.keys).

A queue has one stream per partition (wire.routing), each with the consumer group; every
command below runs on the partitions concerned (worker.queue.routing says which to read).
On a Redis Cluster the partitions other than 0 have hash slots of their own
(wire.keys): reads go per slot, and writes that must be atomic stay in one (streams.writes).

    survey        GET the pool's record, or take it for the pool (streams.survey)
    read          XREADGROUP >, then (entries came) HGET meta epoch
    reclaim       XPENDING IDLE + XCLAIM, where the survey saw orphans, or in a sweep
    cancel_count  GET cancelled (results radixq cancel wrote: producer.cancel)
    renew         XPENDING (own) + XCLAIM ... JUSTID, the leases due
    count         a script: XCLAIM (counts a delivery) if still ours
    complete      a script: HGET meta epoch, HMGET done, XADD result (and dead) per job not
                  done yet, HSET done, HSET failed, XACK (streams.writes)
    release       one MULTI: XADD the job again, XACK (both under WATCH: streams.writes)
    heartbeat     HSET workers (+ HGET meta epoch, unless a read just told it)
    housekeeping  XTRIM MINID, forget dead consumers (a duty of the pool: worker.queue.duties)

A lag Redis cannot tell (nil after an AOF restart) is counted by the survey
(worker.queue.streams.lag).

Redis errors leave as the contract's: transient ones (wire.redis_errors) as
QueueUnavailable, a missing group as QueueLost, fatal ones as QueueRefused (one line).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import redis

from wire.cluster import by_slot
from wire.keys import (
    FIELD_ID,
    FIELD_JOB,
    FIELD_KEY,
    META_EPOCH,
    QueueKeys,
)
from wire.redis_errors import classify, describe, url_of
from wire.routing import RoutingCorrupt, qualify, read_routing, split_id
from wire.status import Heartbeat
from wire.streams import ensure_groups
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
from worker.queue.routing import STEAL_AFTER_S, Router, Survey, read_routed
from worker.queue.streams import writes as streams_writes
from worker.queue.streams.lag import LagCount
from worker.queue.streams.leases import Leases
from worker.queue.streams.retention import ConsumerJanitor, trim_acked_jobs
from worker.queue.streams.survey import SharedSurvey, as_survey

T = TypeVar("T")


def read_entry(entry_id: bytes | str, fields: dict[bytes, bytes], partition: int = 0) -> Entry:
    """An entry as XREADGROUP/XCLAIM hand it over, whatever its fields hold."""
    entry_id = qualify(partition, entry_id.decode() if isinstance(entry_id, bytes) else entry_id)
    key = fields.get(FIELD_KEY.encode(), b"").decode("ascii", "replace")
    raw_id = fields.get(FIELD_ID.encode())
    data = fields.get(FIELD_JOB.encode(), b"")
    if raw_id is None:
        return Entry(entry_id, entry_id, data, f"entry {entry_id} has no {FIELD_ID!r} field", key)
    try:
        job_id = raw_id.decode()
    except UnicodeDecodeError:
        shown = raw_id.decode("utf-8", "backslashreplace")
        problem = f"the {FIELD_ID!r} field of entry {entry_id} is not UTF-8: {shown!r}"
        return Entry(entry_id, shown, data, problem, key)
    if not job_id:
        return Entry(entry_id, entry_id, data, f"entry {entry_id} has an empty {FIELD_ID!r} field", key)
    return Entry(entry_id, job_id, data, key=key)


def _text(value: Any) -> str | None:
    return value.decode() if value is not None else None


def _translated(method: Callable[..., T]) -> Callable[..., T]:
    """Redis errors as the JobQueue contract's."""

    @functools.wraps(method)
    def call(self: RedisJobQueue, *args: Any, **kwargs: Any) -> T:
        try:
            return method(self, *args, **kwargs)
        except RoutingCorrupt as exc:  # NOTE: Redis state someone else wrote: waited out, said once
            raise QueueUnavailable(str(exc)) from None
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
        self,
        client: redis.Redis,
        queue: str,
        name: str,
        min_idle_ms: int,
        dead_after_ms: int,
        steal_after_s: float = STEAL_AFTER_S,
    ) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)
        self.name = name
        self.where = url_of(client)
        self.leases = Leases(self.keys, name, min_idle_ms)
        self.janitor = ConsumerJanitor(self.keys, name, dead_after_ms)
        self.router = Router(name, steal_after_s)
        self.partitions = 1
        self.shared = SharedSurvey(self.keys, name, LagCount())
        self._complete = streams_writes.complete_script(client)
        self._prepared_once = False
        self._turn = 0  # the slot a cluster read waits on next

    def _streams(self) -> list[str]:
        return self.keys.partitions(self.partitions)

    @_translated
    def prepare(self) -> bool:
        self.partitions = read_routing(self.redis, self.keys)[0]
        if self._prepared_once:  # NOTE: a lost group: created here, the record may predate the loss
            ensure_groups(self.redis, self.keys, self.partitions)
            return True
        self._prepared_once = self.shared.prepare(self.redis, self.partitions)
        return self._prepared_once

    @_translated
    def survey(self, max_age_s: float) -> Survey | None:
        record = self.shared.get(self.redis, max_age_s, self.partitions)
        if record is None:
            return None
        self.partitions = record.partitions  # NOTE: its taker made the groups of a new routing
        return self.router.update(as_survey(record))

    def _read(self, partitions: list[int], count: int, block_s: float | None) -> list[Delivery]:
        block_ms = None if block_s is None else int(block_s * 1000)
        index = {self.keys.partition(p): p for p in partitions}
        groups = by_slot(self.redis, list(index))
        if len(groups) > 1:  # NOTE: a cluster: one XREADGROUP per slot, the wait on one of them
            got = self._read_slots(groups, index, count, None)
            if got or block_ms is None:
                return got
            self._turn = (self._turn + 1) % len(groups)
            groups = [groups[self._turn]]
        return self._read_slots(groups, index, count, block_ms)

    def _read_slots(
        self, groups: list[list[str]], index: dict[str, int], count: int, block_ms: int | None
    ) -> list[Delivery]:
        with self.redis.pipeline(transaction=False) as pipe:
            for streams in groups:
                pipe.xreadgroup(
                    self.keys.group, self.name, dict.fromkeys(streams, ">"), count=count, block=block_ms
                )
            replies = pipe.execute()
        found = [
            (entry_id, fields, index[stream.decode()])
            for reply in replies
            for stream, entries in reply or []
            for entry_id, fields in entries
        ]
        if not found:
            return []
        # NOTE: asked once the read is back: the epoch the entries were read under
        epoch = _text(self.redis.hget(self.keys.meta, META_EPOCH))
        return [
            Delivery(read_entry(entry_id, fields, partition), 1, epoch)
            for entry_id, fields, partition in found
        ]

    @_translated
    def read(self, count: int, block_s: float | None) -> list[Delivery]:
        return read_routed(self.router, count, block_s, self._read)

    @_translated
    def reclaim(self, count: int, sweep: bool) -> list[Delivery]:
        own, survey = self.router.own, self.router.survey
        order = [
            p
            for p in own + [p for p in range(self.partitions) if p not in own]
            if sweep or survey.orphans_in(p)
        ]
        taken: list[Delivery] = []
        for partition in order:
            if len(taken) >= count:
                break
            stream = self.keys.partition(partition)
            claimed = self.leases.claim(self.redis, stream, count - len(taken))
            if not claimed:
                continue
            epoch = _text(self.redis.hget(self.keys.meta, META_EPOCH))
            taken += [
                Delivery(read_entry(c.entry_id, c.fields, partition), c.deliveries, epoch) for c in claimed
            ]
        return taken

    @_translated
    def completed(self, job_ids: list[str]) -> list[bool]:
        marks: Any = self.redis.hmget(self.keys.done, job_ids)
        return [mark is not None for mark in marks]

    @_translated
    def cancel_count(self) -> int:
        return int(self.redis.get(self.keys.cancelled) or 0)  # type: ignore[arg-type]

    @_translated
    def complete(self, writes: list[Write], acks: list[str]) -> list[Write]:
        return streams_writes.complete(self.redis, self.keys, writes, acks, self._complete)

    @_translated
    def renew(self, entry_ids: list[str]) -> set[str]:
        lost: set[str] = set()
        for partition, raw_ids in streams_writes.by_partition(entry_ids).items():
            stream = self.keys.partition(partition)
            lost |= {qualify(partition, raw) for raw in self.leases.renew(self.redis, stream, raw_ids)}
        return lost

    @_translated
    def count_attempt(self, entry_id: str) -> int | None:
        partition, raw = split_id(entry_id)
        return self.leases.count_attempt(self.redis, self.keys.partition(partition), raw)

    @_translated
    def release(self, jobs: list[Release]) -> list[Release]:
        return streams_writes.release(self.redis, self.keys, jobs)

    @_translated
    def leave(self) -> None:
        streams = [stream for stream in self._streams() if self.redis.exists(stream)]
        with self.redis.pipeline(transaction=False) as pipe:
            for stream in streams:
                pipe.xpending_range(
                    stream, self.keys.group, min="-", max="+", count=1, consumername=self.name
                )
            held: Any = pipe.execute()
        for stream, pending in zip(streams, held, strict=True):
            if not pending:
                self.redis.xgroup_delconsumer(stream, self.keys.group, self.name)
        self.redis.hdel(self.keys.workers, self.name)

    @_translated
    def heartbeat(self, beat: Heartbeat, epoch: bool) -> str | None:
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.workers, self.name, msgspec.msgpack.encode(beat))
            if epoch:
                pipe.hget(self.keys.meta, META_EPOCH)
            reply: Any = pipe.execute()
        return _text(reply[1]) if epoch else None

    @_translated
    def newest_entry(self) -> tuple[int, int]:
        newest = (0, 0)
        for stream in self._streams():
            try:
                info: Any = self.redis.xinfo_stream(stream)
            except redis.exceptions.NoPermissionError:
                raise  # NOTE: an ACL denial is not a missing stream
            except redis.ResponseError:  # no such key
                continue
            newest = max(newest, entry_key(info["last-generated-id"].decode()))
        return newest

    @_translated
    def housekeeping(self, trim: bool) -> list[str]:
        if trim:
            for stream in self._streams():
                trim_acked_jobs(self.redis, self.keys, stream)
        return self.janitor.sweep(self.redis, self._streams())
