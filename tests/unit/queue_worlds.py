"""One consumer-policy test, two queues: the in-memory JobQueue and the Redis one (fakeredis).

A World enqueues jobs, builds consumers on its queue and reads back what the queue holds, in
the same words for both; tests parametrized over ``world`` check the Consumer's policy, not
the queue it happens to run on.
"""

from __future__ import annotations

from typing import Any, Protocol

import fakeredis

from producer.client import Client
from tests.fake_generator import FakeGenerator
from tests.waiting import LIVENESS_S, drive_until
from wire.keys import FIELD_ID, FIELD_JOB, QueueKeys
from wire.schema import Job, Result, decode_result
from worker.queue.config import ConsumerConfig
from worker.queue.consumer import Consumer
from worker.queue.jobqueue import QueueUnavailable
from worker.queue.memory import MemoryStore
from worker.queue.streams import RedisJobQueue

KEYS = QueueKeys()


def config_for(name: str, **settings: Any) -> ConsumerConfig:
    return ConsumerConfig(**{"name": name, "block_s": 0.01, "poll_s": 0.005, **settings})


class World(Protocol):
    def enqueue(self, jobs: list[Job]) -> None: ...
    def cancel(self, job_ids: list[str]) -> None: ...
    def add_raw(self, job_id: str, data: bytes) -> str: ...
    def consumer(self, generator: FakeGenerator, name: str = "c1", **settings: Any) -> Consumer: ...
    def done(self) -> int: ...
    def failed(self) -> dict[str, str]: ...
    def pending(self) -> int: ...
    def results_by_id(self) -> dict[str, list[Result]]: ...
    def dead(self) -> list[tuple[str, str, int]]: ...
    def outage(self, on: bool) -> None: ...
    def lose_everything(self) -> None: ...


class MemoryWorld:
    def __init__(self, partitions: int = 1) -> None:
        self.store = MemoryStore(partitions=partitions)

    def enqueue(self, jobs: list[Job]) -> None:
        self.store.add(jobs)

    def cancel(self, job_ids: list[str]) -> None:
        self.store.cancel(job_ids)

    def add_raw(self, job_id: str, data: bytes) -> str:
        return self.store.add_raw(job_id, data).entry_id

    def consumer(self, generator: FakeGenerator, name: str = "c1", **settings: Any) -> Consumer:
        config = config_for(name, **settings)
        return Consumer(self.store.queue(name, config.min_idle_s, config.steal_after_s), generator, config)

    def done(self) -> int:
        return len(self.store.done)

    def failed(self) -> dict[str, str]:
        return dict(self.store.failed)

    def pending(self) -> int:
        return len(self.store.pending)

    def results_by_id(self) -> dict[str, list[Result]]:
        return self.store.results_by_id()

    def dead(self) -> list[tuple[str, str, int]]:
        return list(self.store.dead)

    def outage(self, on: bool) -> None:
        self.store.fail_with(QueueUnavailable("the test took the queue away") if on else None)

    def lose_everything(self) -> None:
        self.store.__init__(self.store.clock, self.store.partitions)  # type: ignore[misc]


class RedisWorld:
    def __init__(self, partitions: int = 1) -> None:
        self.server = fakeredis.FakeServer()
        self.redis = fakeredis.FakeRedis(server=self.server)
        self.partitions = partitions

    def enqueue(self, jobs: list[Job]) -> None:
        Client(self.redis, partitions=self.partitions).enqueue(jobs)

    def cancel(self, job_ids: list[str]) -> None:
        Client(self.redis).cancel(job_ids)

    def add_raw(self, job_id: str, data: bytes) -> str:
        return self.redis.xadd(KEYS.jobs, {FIELD_ID: job_id, FIELD_JOB: data}).decode()

    def consumer(self, generator: FakeGenerator, name: str = "c1", **settings: Any) -> Consumer:
        config = config_for(name, **settings)
        queue = RedisJobQueue(
            self.redis, KEYS.queue, name, config.min_idle_ms, config.dead_after_ms, config.steal_after_s
        )
        return Consumer(queue, generator, config)

    def done(self) -> int:
        return int(self.redis.hlen(KEYS.done))

    def failed(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.redis.hgetall(KEYS.failed).items()}

    def pending(self) -> int:
        return sum(
            int(self.redis.xpending(stream, KEYS.group)["pending"])
            for stream in KEYS.partitions(self.partitions)
            if self.redis.exists(stream)
        )

    def results_by_id(self) -> dict[str, list[Result]]:
        found: dict[str, list[Result]] = {}
        for _, fields in self.redis.xrange(KEYS.results):
            result = decode_result(fields[b"result"])
            found.setdefault(result.id, []).append(result)
        return found

    def dead(self) -> list[tuple[str, str, int]]:
        return [
            (f[b"id"].decode(), f[b"reason"].decode(), int(f[b"attempts"]))
            for _, f in self.redis.xrange(KEYS.dead)
        ]

    def outage(self, on: bool) -> None:
        self.server.connected = not on

    def lose_everything(self) -> None:
        self.redis.flushall()


def make_world(kind: str, partitions: int = 1) -> World:
    return MemoryWorld(partitions) if kind == "memory" else RedisWorld(partitions)


def step_until(consumers: list[Consumer], done: int, world: World, timeout_s: float = LIVENESS_S) -> None:
    drive_until(
        lambda: world.done() >= done,
        lambda: [consumer.guarded(consumer.step) for consumer in consumers],
        lambda: f"{done} done (only {world.done()})",
        timeout_s=timeout_s,
    )
