"""What a pool shares (worker.queue.streams.survey, worker.queue.duties): one consumer takes the
survey for all, a duty any consumer can do is done about once a period by the pool as a whole,
whatever its size, and reclaim looks where the survey saw entries of a stopped consumer."""

from __future__ import annotations

import random
import time
from typing import Any

import fakeredis
import msgspec
import pytest

from producer.client import Client
from wire.keys import QueueKeys
from wire.schema import Job
from wire.status import Heartbeat, now_ms
from worker.queue.duties import PoolDuty
from worker.queue.streams import RedisJobQueue
from worker.queue.streams import survey as survey_module


def test_a_pool_of_twenty_takes_one_survey_and_all_read_it(
    fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    Client(fake_redis, partitions=8).enqueue([Job(id=f"j{i}", prompt=f"prompt {i}") for i in range(40)])
    taken: list[str] = []
    real_take = survey_module.take

    def counting(*args: Any) -> survey_module.SurveyRecord:
        taken.append(args[2])  # the consumer taking it
        return real_take(*args)

    monkeypatch.setattr(survey_module, "take", counting)
    queues = [RedisJobQueue(fake_redis, "default", f"c{i:02d}", 60_000, 600_000) for i in range(20)]
    assert all(queue.prepare() for queue in queues)  # the first creates nothing: enqueue did
    surveys = [queue.survey(max_age_s=60.0) for queue in queues]
    assert len(taken) == 1  # by the first consumer, in its prepare; the others read its record
    assert all(s is not None and s.queued == 40 and s.partitions == 8 for s in surveys)
    assert len({queue.shared.last.taken_ms for queue in queues if queue.shared.last}) == 1


def test_a_lone_consumer_does_a_duty_every_period() -> None:
    duty = PoolDuty(every_s=5.0, start_s=0.0, rng=random.Random(1))
    times = []
    for step in range(1, 4001):  # 200 s in steps of 0.05 s
        now = step * 0.05
        if duty.due(now, live=1):
            duty.done(now)
            times.append(now)
    assert len(times) == 40 and all(abs(b - a - 5.0) < 0.06 for a, b in zip(times, times[1:], strict=False))


@pytest.mark.parametrize("pool", [10, 200])
def test_a_pool_does_a_duty_about_once_a_period_whatever_its_size(pool: int) -> None:
    every_s, span_s = 1.0, 2000.0
    duties = [PoolDuty(every_s, 0.0, random.Random(i)) for i in range(pool)]
    done = 0
    for step in range(1, int(span_s / 0.5) + 1):
        now = step * 0.5
        for duty in duties:
            if duty.due(now, live=pool):
                duty.done(now)
                done += 1
    # NOTE: 2,000 expected; without pacing each consumer would do it 2,000 times
    assert 0.8 * span_s / every_s <= done <= 1.2 * span_s / every_s


def _beat(client: fakeredis.FakeRedis, name: str, age_ms: int) -> None:
    beat = Heartbeat(name=name, pid=1, last_seen_ms=now_ms() - age_ms, interval_s=2.0)
    client.hset(QueueKeys().workers, name, msgspec.msgpack.encode(beat))


@pytest.mark.parametrize("holder_beats", [True, False])
def test_reclaim_looks_where_the_survey_saw_a_stopped_consumer_and_a_sweep_everywhere(
    fake_redis: fakeredis.FakeRedis, holder_beats: bool
) -> None:
    """Entries idle past min_idle are reclaimed without a sweep only when their holder's
    heartbeat stopped (the survey counts them as orphaned); a sweep takes them either way."""
    keys = QueueKeys()
    Client(fake_redis, partitions=0).enqueue([Job(id=f"j{i}", prompt="p") for i in range(3)])
    fake_redis.xreadgroup(keys.group, "holder", {keys.jobs: ">"}, count=10)
    _beat(fake_redis, "holder", age_ms=0 if holder_beats else 60_000)  # 60 s: two intervals long past
    time.sleep(0.03)  # simulated latency: idle past min_idle (20 ms)
    queue = RedisJobQueue(fake_redis, keys.queue, "taker", 20, 600_000)
    assert queue.prepare()
    survey = queue.survey(max_age_s=60.0)
    assert survey is not None and survey.orphaned == [0 if holder_beats else 3]
    hinted = queue.reclaim(10, sweep=False)
    assert len(hinted) == (0 if holder_beats else 3)
    swept = queue.reclaim(10, sweep=True)
    assert len(hinted) + len(swept) == 3
    assert all(d.deliveries == 2 for d in hinted + swept)
