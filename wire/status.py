"""What a queue holds right now: counts, rate, ETA, queue lag, consumers and worker heartbeats
(docs/operations.md, Status, explains each field); ``exposition`` renders it for Prometheus."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, NamedTuple

import msgspec
import redis

from wire.cluster import is_cluster
from wire.keys import META_EPOCH, META_FORGOTTEN, META_FORGOTTEN_FAILED, QueueKeys

LOADING = "loading"  # Heartbeat.state of a worker getting its model (worker.queue.loading)


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """What a worker writes into the workers hash every few seconds."""

    name: str
    pid: int
    model: str = ""
    capacity: int = 0
    in_flight: int = 0
    completed: int = 0
    state: str = "running"  # loading | running | draining
    last_seen_ms: int = 0
    interval_s: float = 2.0  # how often it writes this; status calls it dead after several misses
    engine_restarts: int = 0  # scheduler processes restarted after a crash
    unattributed_crashes: int = 0  # engine crashes no single job reproduced (a workload shape)
    data_losses: int = 0  # times it saw Redis lose the queue's data (epoch gone or changed)
    jobs_per_s: float = 0.0  # jobs it finished per second over the last minute or so
    prompt_tokens: int = 0  # prompt tokens of the jobs it finished
    cached_tokens: int = 0  # of which its prefix cache held (Result.usage.cached_tokens)
    prefix_keys: int = 0  # distinct prefix keys among the jobs it ran lately (worker.queue.routing)
    partitions: list[int] = []  # the partitions it owns now
    served_models: list[str] = []  # the model names it answers to; empty: any name, run on ``model``
    device: str = ""  # where its generator runs (cpu, cuda, ...); "" when it does not say
    running: int = 0  # of in_flight: jobs its generator runs now (at most its slots)
    waiting: int = 0  # of in_flight: jobs held, waiting for a slot
    tokens_per_s: float = 0.0  # output tokens it generated per second over the last minute or so

    @property
    def hit_rate(self) -> float | None:
        """Cached over prompt tokens of the jobs it finished; None before the first."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


# A consumer is taken for dead when Redis has not seen it for this many heartbeat intervals
# and its last heartbeat is at least as old (or missing: then after NO_HEARTBEAT_DEAD_MS).
DEAD_AFTER_BEATS = 5
NO_HEARTBEAT_DEAD_MS = 60_000
_NEVER_READ_MS = 1 << 62  # the idle time of a worker with no consumer entry: its heartbeat decides


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
    partitions: int = 1  # partition streams (wire.routing)
    enqueued: int  # distinct job ids ever enqueued
    queued: int  # in the stream, not yet delivered to any worker
    in_flight: int
    done: int  # jobs with a counted result, errors included
    failed: int  # of which errors (dead letters included)
    dead_lettered: int
    cancelled: int = 0  # results ``radixq cancel`` wrote, ever (counted in failed while the ids are kept)
    results_kept: int = 0  # entries in the results stream (collect --trim removes written ones)
    jobs_per_s: float = 0.0  # the live workers' heartbeat rates, summed
    eta_s: float | None = None  # (queued + in flight) / jobs_per_s; 0 when nothing is left; None: no rate
    queue_lag_s: float | None = None  # age of the oldest job not yet delivered; None: none queued
    consumers: list[ConsumerStatus] = []  # and the live workers not reading yet (loading), by heartbeat

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


def serving(client: redis.Redis, keys: QueueKeys) -> list[str]:
    """Names of the workers whose heartbeat says they have their model (any state but LOADING,
    live or not): what waits for workers to come up count."""
    beats: Any = client.hgetall(keys.workers)
    found = {_text(name): decode_heartbeat(data) for name, data in beats.items()}
    return sorted(name for name, beat in found.items() if beat is not None and beat.state != LOADING)


def live_consumers(client: redis.Redis, keys: QueueKeys) -> int:
    """How many workers consume the queue now (``is_alive``): the consumers of its partitions'
    groups, by their heartbeat and their last read, and the workers whose heartbeat is fresh but
    which have not read yet. Reads (HGETALL, XINFO CONSUMERS), no TIME: what collect may call."""
    partitions = read_partitions(client, keys)
    beats: Any = client.hgetall(keys.workers)
    heartbeats = {_text(name): decode_heartbeat(data) for name, data in beats.items()}
    idle: dict[str, int] = {}
    for stream in keys.partitions(partitions):
        try:
            consumers: Any = client.xinfo_consumers(stream, keys.group)
        except redis.ResponseError:  # no stream or no group yet: nobody read it
            continue
        for consumer in consumers:
            name = _text(consumer["name"])
            idle[name] = min(idle.get(name, int(consumer["idle"])), int(consumer["idle"]))
    at_ms = now_ms()
    # NOTE: a heartbeat without a consumer entry has no read to go by: its age alone decides
    return sum(
        is_alive(heartbeats.get(name), idle.get(name, _NEVER_READ_MS), at_ms)[0]
        for name in set(idle) | set(heartbeats)
    )


def read_status(client: redis.Redis, keys: QueueKeys) -> QueueStatus:
    """One consistent-enough snapshot (several reads, not a transaction), over every partition."""
    partitions = read_partitions(client, keys)
    with client.pipeline(transaction=False) as pipe:
        pipe.hlen(keys.enqueued)
        pipe.hlen(keys.done)
        pipe.hlen(keys.failed)
        pipe.xlen(keys.dead)
        pipe.hgetall(keys.workers)
        pipe.hmget(keys.meta, [META_EPOCH, META_FORGOTTEN, META_FORGOTTEN_FAILED])
        pipe.xlen(keys.results)
        pipe.get(keys.cancelled)
        if not is_cluster(client):  # NOTE: a cluster pipeline takes keyed commands only
            pipe.time()
        enqueued, done, failed, dead, beats, meta, results, cancelled, *now = pipe.execute()
    secs, micros = now[0] if now else _node_of(client, keys.meta).time()
    # NOTE: ids a trimming collect forgot (producer.forget) count as enqueued and done
    epoch, forgotten_ids, forgotten_failed = meta[0], int(meta[1] or 0), int(meta[2] or 0)
    enqueued, done, failed = enqueued + forgotten_ids, done + forgotten_ids, failed + forgotten_failed
    redis_now_ms = secs * 1000 + micros // 1000
    queued = in_flight = 0
    oldest_ms: int | None = None  # enqueue time of the oldest job not yet delivered, any partition
    merged: dict[str, tuple[int, int]] = {}  # consumer -> (pending, idle ms) over the partitions
    for stream in keys.partitions(partitions):
        part = _partition_status(client, keys, stream)
        queued += part.queued
        in_flight += part.in_flight
        if part.oldest_ms is not None:
            oldest_ms = part.oldest_ms if oldest_ms is None else min(oldest_ms, part.oldest_ms)
        for c in part.consumers:
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
    # NOTE: a worker that has not read yet (loading its model) has no consumer entry: its live
    # heartbeat alone lists it
    for name, beat in heartbeats.items():
        alive, age_s = is_alive(beat, _NEVER_READ_MS, at_ms)
        if name not in merged and beat is not None and alive:
            listed.append(
                ConsumerStatus(name=name, in_flight=0, idle_ms=0, heartbeat=beat, heartbeat_age_s=age_s)
            )
    jobs_per_s = sum(c.heartbeat.jobs_per_s for c in listed if c.alive and c.heartbeat is not None)
    left = queued + in_flight
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
        cancelled=int(cancelled or 0),
        results_kept=results,
        jobs_per_s=jobs_per_s,
        eta_s=0.0 if not left else (left / jobs_per_s if jobs_per_s > 0 else None),
        queue_lag_s=max(0, redis_now_ms - oldest_ms) / 1000 if oldest_ms is not None else None,
        consumers=listed,
    )


def exposition(status: QueueStatus) -> str:
    """The queue's gauges in Prometheus's text exposition format (``status --prometheus``)."""
    label = 'queue="' + status.queue.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    alive = sum(c.alive for c in status.consumers)
    gauges: list[tuple[str, str, list[tuple[str, float]]]] = [
        ("radixq_queue_enqueued", "Distinct job ids ever enqueued.", [("", status.enqueued)]),
        ("radixq_queue_queued", "Jobs in the stream not yet delivered to a worker.", [("", status.queued)]),
        (
            "radixq_queue_in_flight",
            "Jobs delivered to a worker and not yet acknowledged.",
            [("", status.in_flight)],
        ),
        ("radixq_queue_done", "Jobs with a counted result, errors included.", [("", status.done)]),
        ("radixq_queue_failed", "Jobs whose counted result is an error.", [("", status.failed)]),
        ("radixq_queue_dead_lettered", "Entries in the dead-letter stream.", [("", status.dead_lettered)]),
        ("radixq_queue_results_kept", "Entries in the results stream.", [("", status.results_kept)]),
        (
            "radixq_queue_jobs_per_second",
            "Live workers' completion rates, summed.",
            [("", status.jobs_per_s)],
        ),
        (
            "radixq_queue_lag_seconds",
            "Age of the oldest job not yet delivered (0: none).",
            [("", status.queue_lag_s or 0)],
        ),
        (
            "radixq_queue_workers",
            "Consumers of the queue by liveness.",
            [(',state="alive"', alive), (',state="dead"', len(status.consumers) - alive)],
        ),
    ]
    lines = []
    for name, doc, samples in gauges:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        lines += [f"{name}{{{label}{extra}}} {float(value)!r}" for extra, value in samples]
    return "\n".join(lines) + "\n"


def _node_of(client: Any, key: str) -> redis.Redis:
    """The plain client of the cluster node that holds ``key``."""
    node = client.get_node_from_key(key)
    return client.get_redis_connection(node)  # type: ignore[no-any-return]


def read_partitions(client: redis.Redis, keys: QueueKeys) -> int:
    """The queue's partition count (wire.routing.read_routing: raises RoutingCorrupt)."""
    from wire.routing import read_routing

    return read_routing(client, keys)[0]


class _Partition(NamedTuple):
    queued: int
    in_flight: int
    oldest_ms: int | None  # enqueue time (its entry id) of the oldest entry not yet delivered
    consumers: list[Any]  # XINFO CONSUMERS


def _partition_status(client: redis.Redis, keys: QueueKeys, stream: str) -> _Partition:
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.exceptions.NoPermissionError:
        raise  # NOTE: an ACL denial is not an empty partition
    except redis.ResponseError:  # no stream yet
        groups = []
    group = next((g for g in groups if _text(g["name"]) == keys.group), None)
    oldest: Any = client.xrange(
        stream, min=f"({_text(group['last-delivered-id'])}" if group else "-", count=1
    )
    oldest_ms = int(_text(oldest[0][0]).split("-")[0]) if oldest else None
    if group is None:
        return _Partition(int(client.xlen(stream)), 0, oldest_ms, [])
    if group.get("lag") is not None:
        queued = int(group["lag"])
    else:  # NOTE: Redis cannot tell the lag (after an AOF restart, or deletions): count.
        queued = count_after(client, stream, _text(group["last-delivered-id"]))
    consumers: Any = client.xinfo_consumers(stream, keys.group)
    return _Partition(queued, int(group.get("pending") or 0), oldest_ms, consumers)


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


class RateWindow:
    """Rates of cumulative counters over the last ``window_s`` seconds: the counts are
    sampled (time, *counts) and the rate is the change between the oldest sample in the
    window and the newest, divided by the time between them."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, tuple[float, ...]]] = deque()

    def sample(self, at_s: float, *counts: float) -> tuple[float, ...]:
        """Record ``counts`` at ``at_s``; returns their rates per second (zeros until two
        samples are at least a tenth of a second apart)."""
        self._samples.append((at_s, counts))
        while len(self._samples) > 2 and at_s - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
        first_s, first = self._samples[0]
        elapsed = at_s - first_s
        if elapsed < 0.1:
            return tuple(0.0 for _ in counts)
        return tuple((now - then) / elapsed for now, then in zip(counts, first, strict=True))
