"""deploy/k8s/scaledobject.yaml's metric, read from a real redis-server as KEDA v2.20.2 reads it
(a redis-streams trigger with no consumerGroup is the stream's XLEN; the scalingModifiers
formula sums the triggers; the Deployment is active while the sum exceeds activationTarget and
the HPA asks for ceil(sum / target) workers), through a queue's whole life: jobs enqueued with
no worker running wake the pool, the metric never counts fewer jobs than are unfinished while
workers run (one of them drained midway), and it falls to 0 once they are done, so the pool can
go back to zero. (Why not the group's lag: tests/integration/test_redis_restart.py shows Redis
reporting it nil after a restart from the AOF, which KEDA reads as no backlog.)"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest
import redis

from producer.client import Client
from tests.fake_generator import FakeGenerator
from tests.unit.k8s_files import the, worker_config
from tests.unit.queue_worlds import config_for
from tests.unit.test_routing import group_jobs
from wire.keys import QueueKeys
from worker.queue.consumer import Consumer
from worker.queue.streams import RedisJobQueue

pytestmark = pytest.mark.integration

P = 4  # the queue's partitions: fewer than the ScaledObject covers
JOBS_PER_GROUP = 5
GROUPS = 12


class Keda:
    """The ScaledObject's scaling decision, computed as KEDA's operator and the HPA compute it."""

    def __init__(self, scaled_object: dict[str, Any], client: redis.Redis) -> None:
        self.spec = scaled_object["spec"]
        self.client = client
        modifiers = self.spec["advanced"]["scalingModifiers"]
        self.terms = [term.strip() for term in modifiers["formula"].split("+")]
        assert all(re.fullmatch(r"[A-Za-z_]\w*", term) for term in self.terms), "a sum of triggers"
        self.target = float(modifiers["target"])
        self.activation = float(modifiers["activationTarget"])

    def metric(self) -> float:
        values = {}
        for trigger in self.spec["triggers"]:
            metadata = trigger["metadata"]
            assert trigger["type"] == "redis-streams" and "consumerGroup" not in metadata  # XLEN mode
            values[trigger["name"]] = self.client.xlen(metadata["stream"])  # 0 for a missing stream
        return float(sum(values[term] for term in self.terms))

    def replicas(self) -> int:
        value = self.metric()
        if value <= self.activation:
            return self.spec["minReplicaCount"]  # after cooldownPeriod
        wanted = math.ceil(value / self.target)
        return max(1, self.spec["minReplicaCount"], min(wanted, self.spec["maxReplicaCount"]))


def test_the_trigger_wakes_the_pool_follows_the_backlog_and_lets_it_go_to_zero(redis_url: str) -> None:
    queue = worker_config().worker.queue  # the workers' queue, which the triggers name
    client = Client.from_url(redis_url, queue, partitions=P)
    keda = Keda(the("ScaledObject"), client.redis)
    keys = QueueKeys(queue)
    assert keda.metric() == 0 and keda.replicas() == 0

    jobs = group_jobs([f"g{i}" for i in range(GROUPS)], JOBS_PER_GROUP)
    client.enqueue(jobs)
    assert keda.metric() == len(jobs) and keda.replicas() == 1  # no worker yet: woken from zero
    by_stream = [client.redis.xlen(stream) for stream in keys.partitions(P)]
    assert sum(by_stream) == len(jobs) and max(by_stream) < len(jobs)  # one stream alone sees too few
    assert all(client.redis.xpending(s, keys.group)["pending"] == 0 for s in keys.partitions(P))

    def consumer(name: str) -> Consumer:
        config = config_for(name, queue=queue, survey_s=0.01, heartbeat_s=0.02, housekeeping_s=0.01)
        side = RedisJobQueue(client.redis, queue, name, config.min_idle_ms, config.dead_after_ms, 0.0)
        return Consumer(side, FakeGenerator(capacity=4, latency_s=0.005), config)

    pool = [consumer("w1"), consumer("w2")]
    lowest_margin, released = len(jobs), 0
    for _ in range(20_000):
        unfinished = len(jobs) - client.redis.hlen(keys.done)
        lowest_margin = min(lowest_margin, int(keda.metric()) - unfinished)
        if unfinished == 0 and keda.metric() == 0:
            break
        for c in pool:
            c.guarded(c.step)
        if len(pool) == 2 and pool[1].held and client.redis.hlen(keys.done) >= len(jobs) // 4:
            # scaled down midway: w2 drains at once (its deadline is now), giving its jobs back
            released = pool[1].held
            pool[1].config = dataclasses.replace(pool[1].config, drain_timeout_s=0)
            pool[1].request_stop()
            pool[1].drain()
            pool = pool[:1]
            lowest_margin = min(
                lowest_margin, int(keda.metric()) - (len(jobs) - client.redis.hlen(keys.done))
            )
    assert released > 0 and len(pool) == 1
    assert lowest_margin >= 0  # never fewer than the unfinished jobs
    assert client.redis.hlen(keys.done) == len(jobs) and keda.metric() == 0
    assert keda.replicas() == 0  # the pool may go back to zero
    pool[0].request_stop()
    pool[0].drain()
    client.close()
