"""Producers enqueueing into one queue at once, against a real redis-server: overlapping ids go
in once each, reported as enqueued by exactly one producer; an id they give different content
is kept as the first one wrote it and reported changed by the other."""

from __future__ import annotations

import threading

import pytest
import redis

from producer.client import Client, EnqueueReport
from producer.digest import job_digest
from tests.jobs_stream import job_entries
from wire.keys import QueueKeys
from wire.schema import Job

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


def test_overlapping_producers_enqueue_each_id_once(redis_url: str) -> None:
    shared = [Job(id=f"s{i:04d}", prompt=f"shared {i}") for i in range(1500)]
    mine = {
        name: [Job(id=f"{name}{i:04d}", prompt=f"own {i}") for i in range(500)] for name in ("a", "b", "c")
    }
    conflict = {name: Job(id="x", prompt=f"content of {name}") for name in mine}
    reports: dict[str, EnqueueReport] = {}
    start = threading.Barrier(len(mine))

    def produce(name: str, offset: int) -> None:
        rows = shared[offset:] + shared[:offset] + mine[name] + [conflict[name]]  # each starts elsewhere
        client = Client.from_url(redis_url)
        start.wait()
        reports[name] = client.enqueue(rows, batch_size=50)
        client.close()

    threads = [threading.Thread(target=produce, args=(n, i * 500)) for i, n in enumerate(mine)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    admin = redis.Redis.from_url(redis_url)
    entries = [fields[b"id"].decode() for _, fields in job_entries(admin)]
    everything = {job.id for job in shared} | {job.id for rows in mine.values() for job in rows} | {"x"}
    assert sorted(entries) == sorted(everything)  # each id has one entry
    order = [item.decode() for item in admin.lrange(KEYS.order, 0, -1)]
    assert sorted(order) == sorted(everything)
    enqueued = [job_id for report in reports.values() for job_id in report.enqueued]
    assert sorted(enqueued) == sorted(everything)  # each by exactly one producer
    winner = next(name for name, report in reports.items() if "x" in report.enqueued)
    assert admin.hget(KEYS.digests, "x").decode() == job_digest(conflict[winner])
    assert all(reports[name].changed == ["x"] for name in mine if name != winner)
    admin.close()
