"""What a queue holds right now: counts, consumers and worker heartbeats."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import redis

from producer.keys import META_EPOCH, META_PARTITIONS, QueueKeys


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker writes into the workers hash every few seconds."""

    name: str
    pid: int
    model: str = ""
    capacity: int = 0
    in_flight: int = 0
    completed: int = 0
    state: str = "running"  # running | draining
    last_seen_ms: int = 0
    interval_s: float = 2.0  # how often it writes this; status calls it dead after several misses
    engine_restarts: int = 0  # scheduler processes restarted after a crash
    unattributed_crashes: int = 0  # engine crashes no single job reproduced (a workload shape)
    data_losses: int = 0  # times it saw Redis lose the queue's data (epoch gone or changed)
    prompt_tokens: int = 0  # prompt tokens of the jobs it finished
    cached_tokens: int = 0  # of which its prefix cache held (Result.usage.cached_tokens)
    prefix_keys: int = 0  # distinct prefix keys among the jobs it ran lately (worker.queue.routing)
    partitions: list[int] = []  # the partitions it owns now

    @property
    def hit_rate(self) -> float | None:
        """Cached over prompt tokens of the jobs it finished; None before the first."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


# A consumer is taken for dead when Redis has not seen it for this many heartbeat intervals
# and its last heartbeat is at least as old (or missing: then after NO_HEARTBEAT_DEAD_MS).
DEAD_AFTER_BEATS = 5
NO_HEARTBEAT_DEAD_MS = 60_000


class ConsumerStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    in_flight: int  # entries delivered to it and not yet acked (its pending list)
    idle_ms: int  # since it last read or claimed from the jobs stream (XINFO CONSUMERS idle)
    heartbeat: Heartbeat | None = None
    heartbeat_age_s: float | None = None  # since its last heartbeat; None: it has none
    alive: bool = True  # False: it missed DEAD_AFTER_BEATS heartbeats and reads nothing (see is_alive)


class QueueStatus(msgspec.Struct, frozen=True, kw_only=True):
    queue: str
    epoch: str | None = None  # written by the first enqueue; None: never enqueued, or Redis lost it
    partitions: int = 1  # partition streams (producer.routing)
    enqueued: int  # distinct job ids ever enqueued
    queued: int  # in the stream, not yet delivered to any worker
    in_flight: int
    done: int  # jobs with a counted result, errors included
    failed: int  # of which errors (dead letters included)
    dead_lettered: int
    results_kept: int = 0  # entries in the results stream (collect --trim removes written ones)
    consumers: list[ConsumerStatus] = []

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


_heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)


def decode_heartbeat(data: bytes) -> Heartbeat | None:
    try:
        return _heartbeat_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def is_alive(beat: Heartbeat | None, idle_ms: int, at_ms: int) -> tuple[bool, float | None]:
    """(alive, heartbeat age in s). Dead: neither a read/claim nor a heartbeat for
    DEAD_AFTER_BEATS of its heartbeat intervals; with no heartbeat at all, idle
    NO_HEARTBEAT_DEAD_MS. A worker whose heartbeat writes fail (Redis at maxmemory) but
    which still reads stays alive."""
    if beat is None:
        return idle_ms < NO_HEARTBEAT_DEAD_MS, None
    age_s = max(0.0, (at_ms - beat.last_seen_ms) / 1000)
    limit_s = DEAD_AFTER_BEATS * max(beat.interval_s, 0.1)
    return age_s <= limit_s or idle_ms <= limit_s * 1000, age_s


def read_status(client: redis.Redis, keys: QueueKeys) -> QueueStatus:
    """One consistent-enough snapshot (several reads, not a transaction), over every partition."""
    partitions = read_partitions(client, keys)
    with client.pipeline(transaction=False) as pipe:
        pipe.hlen(keys.enqueued)
        pipe.hlen(keys.done)
        pipe.hlen(keys.failed)
        pipe.xlen(keys.dead)
        pipe.hgetall(keys.workers)
        pipe.hget(keys.meta, META_EPOCH)
        pipe.xlen(keys.results)
        enqueued, done, failed, dead, beats, epoch, results = pipe.execute()
    queued = in_flight = 0
    merged: dict[str, tuple[int, int]] = {}  # consumer -> (pending, idle ms) over the partitions
    for stream in keys.partitions(partitions):
        waiting, pending, consumers = _partition_status(client, keys, stream)
        queued += waiting
        in_flight += pending
        for c in consumers:
            name, held, idle = _text(c["name"]), int(c["pending"]), int(c["idle"])
            before = merged.get(name)
            merged[name] = (held, idle) if before is None else (before[0] + held, min(before[1], idle))
    heartbeats = {_text(name): decode_heartbeat(data) for name, data in beats.items()}
    at_ms = now_ms()
    listed = []
    for name, (held, idle_ms) in merged.items():
        beat = heartbeats.get(name)
        alive, age_s = is_alive(beat, idle_ms, at_ms)
        listed.append(
            ConsumerStatus(
                name=name, in_flight=held, idle_ms=idle_ms, heartbeat=beat, heartbeat_age_s=age_s, alive=alive
            )
        )
    return QueueStatus(
        queue=keys.queue,
        epoch=_text(epoch) if epoch is not None else None,
        partitions=partitions,
        enqueued=enqueued,
        queued=queued,
        in_flight=in_flight,
        done=done,
        failed=failed,
        dead_lettered=dead,
        results_kept=results,
        consumers=listed,
    )


def read_partitions(client: redis.Redis, keys: QueueKeys) -> int:
    value: Any = client.hget(keys.meta, META_PARTITIONS)
    return max(1, int(value)) if value is not None else 1


def _partition_status(client: redis.Redis, keys: QueueKeys, stream: str) -> tuple[int, int, list[Any]]:
    """(queued, in flight, XINFO CONSUMERS) of one partition stream."""
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.ResponseError:  # no stream yet
        return int(client.xlen(stream)), 0, []
    group = next((g for g in groups if _text(g["name"]) == keys.group), None)
    if group is None:
        return int(client.xlen(stream)), 0, []
    if group.get("lag") is not None:
        queued = int(group["lag"])
    else:  # NOTE: Redis cannot tell the lag (after an AOF restart, or deletions): count.
        queued = count_after(client, stream, _text(group["last-delivered-id"]))
    consumers: Any = client.xinfo_consumers(stream, keys.group)
    return queued, int(group.get("pending") or 0), consumers


def count_after(client: redis.Redis, stream: str, entry_id: str, chunk: int = 1000) -> int:
    """How many entries of ``stream`` come after ``entry_id`` (XRANGE in chunks: O(count))."""
    count, start = 0, f"({entry_id}"
    while True:
        entries: Any = client.xrange(stream, min=start, max="+", count=chunk)
        count += len(entries)
        if len(entries) < chunk:
            return count
        start = f"({_text(entries[-1][0])}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
