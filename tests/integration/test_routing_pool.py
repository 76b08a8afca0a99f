"""Routing with real Redis: a worker killed with SIGKILL while it holds prefix groups (its
groups and jobs move to the survivor), and a local 3-node Redis Cluster running
enqueue -> workers -> collect on a partitioned queue."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from producer.client import Client
from producer.collector import Collector
from tests.fake_generator import FakeGenerator, fake_text
from tests.integration.procs import radixq, start_worker
from tests.redis_cluster import cluster_client, local_cluster
from tests.unit.queue_worlds import config_for
from tests.unit.test_routing import group_jobs, group_keys
from tests.waiting import LIVENESS_S, drive_until, wait_until
from wire.keys import QueueKeys
from wire.routing import partition_of, prefix_key
from wire.schema import decode_result
from wire.status import decode_heartbeat, serving
from worker.queue.consumer import Consumer
from worker.queue.routing import assign
from worker.queue.streams import RedisJobQueue

pytestmark = pytest.mark.integration

P = 4
KEYS = QueueKeys()


def test_sigkill_of_the_worker_holding_groups_moves_them_to_the_survivor(
    redis_url: str, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url, partitions=P)
    env = {
        "RADIXQ_FAKE_CAPACITY": "8",
        "RADIXQ_FAKE_LATENCY_S": "0.05",
        "RADIXQ_MIN_IDLE_S": "1.0",
        "RADIXQ_HEARTBEAT_S": "0.2",
    }
    victim = start_worker(redis_url, "victim", tmp_path / "victim.log", **env)
    survivor = start_worker(redis_url, "survivor", tmp_path / "survivor.log", **env)
    try:
        wait_until(lambda: len(serving(client.redis, KEYS)) == 2, "both workers' heartbeats, their models loaded")
        keys = group_keys({"victim": 2, "survivor": 2}, ["victim", "survivor"], P)
        first = group_jobs(list(keys), 40)
        client.enqueue(first)

        def victim_holds() -> int:
            return sum(
                len(client.redis.xpending_range(stream, KEYS.group, "-", "+", 1000, consumername="victim"))
                for stream in KEYS.partitions(P)
            )

        wait_until(lambda: victim_holds() > 0 and client.redis.hlen(KEYS.done) >= 20, "the victim at work")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)

        def survivor_owns_all() -> bool:
            beat = decode_heartbeat(client.redis.hget(KEYS.workers, "survivor") or b"")
            return beat is not None and beat.partitions == list(range(P))

        wait_until(survivor_owns_all, "the survivor to own every partition")
        late = group_jobs([k for k, owner in keys.items() if owner == "victim"], 10, tag="late")
        client.enqueue(late)
        out = tmp_path / "out.jsonl"
        report = Collector(client.redis).collect(out, wait=True, timeout_s=90)
        assert report.missing == []
    finally:
        for proc in (victim, survivor):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        assert survivor.wait(timeout=LIVENESS_S) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["id"] for line in lines] == [job.id for job in first + late]  # each once, in order
    assert all(line["choices"][0]["text"] == fake_text(line["id"]) for line in lines)
    late_ids = {job.id for job in late}
    ran_late = {
        decode_result(fields[b"result"]).worker
        for _, fields in client.redis.xrange(KEYS.results)
        if fields[b"id"].decode() in late_ids
    }
    assert ran_late == {"survivor"}  # the victim's groups moved
    for stream in KEYS.partitions(P):
        assert client.redis.xpending(stream, KEYS.group)["pending"] == 0
    assert "reclaimed" in (tmp_path / "survivor.log").read_text()
    client.close()


@pytest.fixture(scope="module")
def cluster_ports():  # type: ignore[no-untyped-def]
    with local_cluster(3) as ports:
        yield ports


def test_a_partitioned_queue_runs_on_a_redis_cluster(cluster_ports: list[int], tmp_path: Path) -> None:
    redis = cluster_client(cluster_ports)
    client = Client(redis, "clustered", partitions=P)
    jobs = group_jobs([f"g{i}" for i in range(6)], 8)
    assert len(client.enqueue(jobs).enqueued) == len(jobs)
    streams = client.keys.partitions(P)
    together = {
        redis.keyslot(key) for key in [streams[0], client.keys.results, client.keys.done, client.keys.meta]
    }
    assert len(together) == 1  # the keys of the transactions that must stay atomic share a slot
    assert len({redis.keyslot(key) for key in streams}) == P  # the partitions spread over slots

    def consumer(name: str) -> Consumer:
        config = config_for(name, queue="clustered", survey_s=0.01, heartbeat_s=0.02)
        queue = RedisJobQueue(redis, "clustered", name, config.min_idle_ms, config.dead_after_ms, 0.0)
        return Consumer(queue, FakeGenerator(capacity=4, latency_s=0.01), config)

    pool = [consumer("c1"), consumer("c2")]
    steps = 0

    def step_pool() -> None:
        nonlocal pool, steps
        for c in pool:
            c.guarded(c.step)
        steps += 1
        if steps == 20:  # one leaves midway: its unfinished jobs go back (a MULTI on the cluster)
            pool[1].request_stop()
            pool[1].drain()
            pool = pool[:1]

    drive_until(lambda: redis.hlen(client.keys.done) >= len(jobs), step_pool, "every job done")
    out = tmp_path / "out.jsonl"
    report = Collector(redis, "clustered").collect(out, wait=True, timeout_s=30)
    assert report.missing == []
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [job.id for job in jobs]
    owners = {p: n for n, owned in assign(P, ["c1", "c2"]).items() for p in owned}
    assert set(owners.values()) == {"c1", "c2"}
    assert partition_of(prefix_key(jobs[0]), P) in owners
    for stream in streams:
        assert redis.xpending(stream, client.keys.group)["pending"] == 0
    redis.close()


def test_status_shows_each_workers_cache_and_partitions(redis_url: str) -> None:
    client = Client.from_url(redis_url, partitions=P)
    client.enqueue(group_jobs(["g0", "g1"], 3))
    config = config_for("w1", survey_s=0.01, heartbeat_s=30)  # alive while status starts
    queue = RedisJobQueue(client.redis, "default", "w1", config.min_idle_ms, config.dead_after_ms)
    consumer = Consumer(queue, FakeGenerator(capacity=8), config)
    while client.redis.hlen(KEYS.done) < 6:
        consumer.guarded(consumer.step)
    consumer.tally.saw("extra", 100, 60)  # the fake engine caches nothing: count some hits
    consumer._heartbeat("running")
    tally = consumer.tally
    text = radixq("status", "--redis-url", redis_url).stdout
    rate = tally.cached_tokens / tally.prompt_tokens
    assert f"cache hits {rate:.0%} ({tally.cached_tokens} of {tally.prompt_tokens} prompt tokens)" in text
    assert f"{tally.prefix_keys} prefix keys, owns partitions 0,1,2,3" in text
    assert "partitions    4" in text
    snapshot = json.loads(radixq("status", "--redis-url", redis_url, "--json").stdout)
    (listed,) = snapshot["consumers"]
    assert snapshot["partitions"] == P and listed["heartbeat"]["prefix_keys"] == 3
    client.close()
