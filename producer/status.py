"""What a queue holds right now: counts, consumers and worker heartbeats."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import redis

from producer.keys import QueueKeys


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


class ConsumerStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    in_flight: int  # entries delivered to it and not yet acked (its pending list)
    idle_ms: int
    heartbeat: Heartbeat | None = None


class QueueStatus(msgspec.Struct, frozen=True, kw_only=True):
    queue: str
    enqueued: int  # distinct job ids ever enqueued
    queued: int  # in the stream, not yet delivered to any worker
    in_flight: int
    done: int  # jobs with a counted result, errors included
    failed: int  # of which errors (dead letters included)
    dead_lettered: int
    consumers: list[ConsumerStatus] = []

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


_heartbeat_decoder = msgspec.msgpack.Decoder(Heartbeat)


def decode_heartbeat(data: bytes) -> Heartbeat | None:
    try:
        return _heartbeat_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def read_status(client: redis.Redis, keys: QueueKeys) -> QueueStatus:
    """One consistent-enough snapshot (several reads, not a transaction)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.hlen(keys.enqueued)
        pipe.hlen(keys.done)
        pipe.hlen(keys.failed)
        pipe.xlen(keys.dead)
        pipe.xlen(keys.jobs)
        pipe.hgetall(keys.workers)
        enqueued, done, failed, dead, stream_len, beats = pipe.execute()
    group: dict[str, Any] = {}
    consumers: list[dict[str, Any]] = []
    try:
        group = next((g for g in client.xinfo_groups(keys.jobs) if _text(g["name"]) == keys.group), {})
        if group:
            consumers = client.xinfo_consumers(keys.jobs, keys.group)
    except redis.ResponseError:  # no stream yet
        pass
    lag = group.get("lag")
    queued = int(lag) if lag is not None else max(0, stream_len - int(group.get("entries-read") or 0))
    heartbeats = {_text(name): decode_heartbeat(data) for name, data in beats.items()}
    listed = [
        ConsumerStatus(
            name=_text(c["name"]),
            in_flight=int(c["pending"]),
            idle_ms=int(c["idle"]),
            heartbeat=heartbeats.get(_text(c["name"])),
        )
        for c in consumers
    ]
    return QueueStatus(
        queue=keys.queue,
        enqueued=enqueued,
        queued=queued if group else stream_len,
        in_flight=int(group.get("pending") or 0),
        done=done,
        failed=failed,
        dead_lettered=dead,
        consumers=listed,
    )


def now_ms() -> int:
    return int(time.time() * 1000)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
