"""Routing across a pool (worker.queue.routing, wire.routing), on both queues: jobs of a
prefix group run on the worker that owns its partition; workers joining, leaving, dying and
running dry (stealing) keep every job done exactly once."""

from __future__ import annotations

import random
import time
from collections import defaultdict

import fakeredis
import pytest

from producer.client import Client
from tests.fake_generator import FakeGenerator
from tests.unit.queue_worlds import World, config_for, make_world
from tests.waiting import LIVENESS_S, drive_until
from wire.keys import QueueKeys
from wire.routing import partition_of, prefix_key, qualify, split_id
from wire.schema import Job
from worker.queue.consumer import Consumer
from worker.queue.routing import PrefixTally, Router, assign, survey_of
from worker.queue.streams import RedisJobQueue

P = 8
FAST = {"survey_s": 0.01, "heartbeat_s": 0.2, "steal_after_s": 0.0}  # a worker is dead after 5 beats: 1 s


@pytest.fixture(params=["memory", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def owners(workers: list[str], partitions: int = P) -> dict[int, str]:
    return {p: name for name, owned in assign(partitions, workers).items() for p in owned}


def group_keys(wanted: dict[str, int], workers: list[str], partitions: int = P) -> dict[str, str]:
    """Prefix keys ``g0, g1, ...`` picked so that each worker owns ``wanted[worker]`` groups;
    returns key -> owner."""
    owner_of = owners(workers, partitions)
    picked: dict[str, str] = {}
    left = dict(wanted)
    index = 0
    while any(left.values()):
        key = f"g{index}"
        index += 1
        owner = owner_of[partition_of(prefix_key(Job(id="x", prompt="x", prefix_key=key)), partitions)]
        if left.get(owner, 0) > 0:
            left[owner] -= 1
            picked[key] = owner
    return picked


def group_jobs(keys: list[str], per_group: int, seed: int = 0, tag: str = "") -> list[Job]:
    jobs = [
        Job(id=f"{tag}{key}-{i}", prompt=f"shared prefix of {key} then tail {i}", prefix_key=key)
        for key in keys
        for i in range(per_group)
    ]
    random.Random(seed).shuffle(jobs)
    return jobs


def run_until(consumers: list[Consumer], world: World, done: int, timeout_s: float = LIVENESS_S) -> None:
    drive_until(
        lambda: world.done() >= done,
        lambda: [consumer.guarded(consumer.step) for consumer in consumers],
        lambda: f"{done} done (only {world.done()})",
        timeout_s=timeout_s,
    )


def warm(consumers: list[Consumer], rounds: int = 3) -> None:
    """Step idle consumers until each has seen the others' heartbeats."""
    for _ in range(rounds):
        for consumer in consumers:
            consumer.guarded(consumer.step)
        time.sleep(0.03)  # simulated latency: the heartbeat interval passes between rounds


def runner_of(world: World) -> dict[str, str]:
    return {job_id: results[0].worker for job_id, results in world.results_by_id().items()}


def split_groups(world: World) -> int:
    """Prefix groups whose jobs ran on more than one worker."""
    ran: dict[str, set[str]] = defaultdict(set)
    for job_id, worker in runner_of(world).items():
        ran[job_id.split("-")[0]].add(worker)
    return sum(len(workers) > 1 for workers in ran.values())


# ---- assignment ------------------------------------------------------------------------------


def test_assignment_is_balanced_and_moves_few_partitions() -> None:
    workers = [f"w{i}" for i in range(4)]
    before = owners(workers, 64)
    assert sorted(before) == list(range(64))
    assert all(len(owned) == 16 for owned in assign(64, workers).values())
    assert owners(list(reversed(workers)), 64) == before  # every worker computes the same
    after_leave = owners(workers[:3], 64)
    moved = sum(before[p] != after_leave[p] for p in range(64))
    assert 16 <= moved <= 16 + 8  # the leaver's 16, and a few to keep the load bounded
    after_join = owners([*workers, "w4"], 64)
    assert all(len(owned) <= 13 for owned in assign(64, [*workers, "w4"]).values())
    assert sum(before[p] != after_join[p] for p in range(64)) <= 13 + 8


def test_steal_order_waits_for_the_owner_then_takes_from_the_far_end_of_the_longest_backlog() -> None:
    now = [0.0]
    router = Router("a", steal_after_s=1.0, clock=lambda: now[0])
    lag = [3, 1, 4, 1, 5, 9, 2, 6]
    survey = router.update(survey_of(8, lag, 0, ["a", "b", "c"]))
    assert router.steal_order() == []  # the owners get steal_after_s to take their jobs
    now[0] = 1.0
    router.update(survey)
    owned = assign(8, ["a", "b", "c"])
    backlog = {name: sum(lag[p] for p in parts) for name, parts in owned.items() if name != "a"}
    expected = [
        p
        for name in sorted(backlog, key=lambda n: -backlog[n])
        for p in sorted(owned[name], reverse=True)
        if lag[p]
    ]
    assert router.steal_order() == expected
    router.adopted = expected[-1]
    assert router.steal_order() == [expected[-1], *expected[:-1]]
    assert router.read_order() == [p for p in owned["a"] if lag[p]]


def test_entry_ids_name_their_partition() -> None:
    assert split_id(qualify(0, "5-1")) == (0, "5-1") and qualify(0, "5-1") == "5-1"
    assert split_id(qualify(3, "5-1")) == (3, "5-1")


def test_prefix_key_is_the_explicit_key_or_the_prompt_start() -> None:
    a = Job(id="a", prompt="x" * 300 + "tail a")
    b = Job(id="b", prompt="x" * 300 + "tail b")
    c = Job(id="c", prompt="y" + "x" * 300)
    assert prefix_key(a) == prefix_key(b) != prefix_key(c)
    assert prefix_key(Job(id="d", prompt="p", prefix_key="k")) == prefix_key(
        Job(id="e", prompt="q", prefix_key="k")
    )


# ---- pools -----------------------------------------------------------------------------------


def test_groups_run_on_the_worker_that_owns_them(kind: str) -> None:
    world = make_world(kind, P)
    settings = {**FAST, "steal_after_s": 60.0}  # no stealing: only ownership decides
    pool = [
        world.consumer(FakeGenerator(capacity=64, latency_s=0.02), name, **settings) for name in ("c1", "c2")
    ]
    warm(pool)
    keys = group_keys({"c1": 3, "c2": 3}, ["c1", "c2"])
    world.enqueue(group_jobs(list(keys), 6))
    run_until(pool, world, 36)
    assert {job_id: worker for job_id, worker in runner_of(world).items()} == {
        job_id: keys[job_id.split("-")[0]] for job_id in runner_of(world)
    }
    assert world.pending() == 0


def test_a_dry_worker_steals_whole_partitions_and_an_unpartitioned_queue_splits_groups(kind: str) -> None:
    splits = {}
    for partitions in (P, 1):
        world = make_world(kind, partitions)
        pool = [
            world.consumer(FakeGenerator(capacity=8, latency_s=0.01), name, **FAST) for name in ("c1", "c2")
        ]
        warm(pool)
        keys = group_keys({"c1": 6}, ["c1", "c2"], P)  # every group is c1's: c2 can only steal
        world.enqueue(group_jobs(list(keys), 8, seed=partitions))
        run_until(pool, world, 48)
        ran = runner_of(world)
        assert sorted(ran) == sorted(job.id for job in group_jobs(list(keys), 8))
        assert all(len(results) == 1 for results in world.results_by_id().values())
        assert "c2" in ran.values()  # c2 did not idle
        splits[partitions] = split_groups(world)
    assert splits[P] <= 3 and splits[1] >= 5  # owner and thief meet in one partition; FCFS splits most


def test_workers_joining_and_leaving_rebalance_partitions(kind: str) -> None:
    world = make_world(kind, P)
    pool = {
        name: world.consumer(FakeGenerator(capacity=8, latency_s=0.01), name, **FAST) for name in ("c1", "c2")
    }
    warm(list(pool.values()))
    world.enqueue(group_jobs([f"g{i}" for i in range(8)], 4, tag="a"))  # the queue's partitions come with it
    run_until(list(pool.values()), world, 16)
    warm(list(pool.values()))
    assert {n: c._survey.own for n, c in pool.items() if c._survey} == assign(P, ["c1", "c2"])

    pool["c3"] = world.consumer(FakeGenerator(capacity=8, latency_s=0.01), "c3", **FAST)
    warm(list(pool.values()))
    assert {n: c._survey.own for n, c in pool.items() if c._survey} == assign(P, ["c1", "c2", "c3"])
    run_until(list(pool.values()), world, 32)

    leaver = pool.pop("c2")
    leaver.request_stop()
    leaver.drain()
    warm(list(pool.values()))
    assert {n: c._survey.own for n, c in pool.items() if c._survey} == assign(P, ["c1", "c3"])
    world.enqueue(group_jobs([f"g{i}" for i in range(8)], 4, tag="b"))
    run_until(list(pool.values()), world, 64)
    ran = runner_of(world)
    assert len(ran) == 64 and all(len(r) == 1 for r in world.results_by_id().values())
    assert {ran[job_id] for job_id in ran if job_id.startswith("b")} <= {"c1", "c3"}


def test_a_dead_workers_groups_and_jobs_move_to_a_live_one(kind: str) -> None:
    world = make_world(kind, P)
    settings = {**FAST, "min_idle_s": 0.3}
    c1 = world.consumer(FakeGenerator(capacity=64, latency_s=0.01), "c1", **settings)
    c2 = world.consumer(FakeGenerator(capacity=64, latency_s=3600), "c2", **settings)  # never finishes
    warm([c1, c2])
    keys = group_keys({"c1": 2, "c2": 2}, ["c1", "c2"])
    world.enqueue(group_jobs(list(keys), 5))
    for _ in range(3):  # each reads its own groups; c2 then dies holding them (no drain, no beat)
        for consumer in (c1, c2):
            consumer.guarded(consumer.step)
    assert c2.held == 10
    run_until([c1], world, 20)
    # c2's beat ages out: its partitions move
    drive_until(
        lambda: c1._survey is not None and c1._survey.own == list(range(P)),
        lambda: c1.guarded(c1.step),
        "c1 to own every partition",
    )
    assert set(runner_of(world).values()) == {"c1"}
    world.enqueue(group_jobs([k for k, owner in keys.items() if owner == "c2"], 3, tag="late"))
    run_until([c1], world, 26)
    assert all(len(r) == 1 for r in world.results_by_id().values())


# ---- producer side, window, heartbeat ----------------------------------------------------------


def test_enqueue_routes_by_prefix_key_and_the_queue_keeps_its_routing(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    keys = QueueKeys()
    jobs = group_jobs([f"g{i}" for i in range(10)], 3)
    Client(fake_redis, partitions=P).enqueue(jobs)
    Client(fake_redis, partitions=3).enqueue([Job(id="later", prompt="x", prefix_key="g1")])  # P stays
    by_id = {}
    for p, stream in enumerate(keys.partitions(P)):
        for _, fields in fake_redis.xrange(stream):
            by_id[fields[b"id"].decode()] = (p, fields[b"key"].decode())
    for job in [*jobs, Job(id="later", prompt="x", prefix_key="g1")]:
        key = prefix_key(job)
        assert by_id[job.id] == (partition_of(key, P), key)
    status = Client(fake_redis).status()
    assert (status.partitions, status.queued, status.enqueued) == (P, 31, 31)


def test_a_dead_letter_goes_back_to_its_partition(fake_redis: fakeredis.FakeRedis) -> None:
    client = Client(fake_redis, partitions=P)
    job = Job(id="lost", prompt="x", prefix_key="g3")
    client.enqueue([job])
    settings = {**FAST, "max_attempts": 1, "min_idle_s": 0.05}

    def consumer(name: str) -> Consumer:
        config = config_for(name, **settings)
        queue = RedisJobQueue(fake_redis, "default", name, config.min_idle_ms, config.dead_after_ms, 0.0)
        return Consumer(queue, FakeGenerator(capacity=4, latency_s=3600), config)

    holder, other = consumer("c1"), consumer("c2")
    # c1 takes it (by ownership or stealing), then stops renewing: it "died"
    drive_until(lambda: holder.held > 0, lambda: holder.guarded(holder.step), "c1 to hold the job")

    def other_steps() -> None:
        other.guarded(other.step)
        time.sleep(0.01)  # simulated latency: the held entry ages towards min_idle between steps

    # c2 reclaims it: a second delivery, over max_attempts
    drive_until(lambda: bool(client.dead_letters()), other_steps, "the job to reach the dead letters")
    assert client.requeue_dead() == ["lost"]
    stream = QueueKeys().partition(partition_of(prefix_key(job), P))
    assert [f[b"id"] for _, f in fake_redis.xrange(stream)][-1] == b"lost"


def test_a_small_queue_is_shared_by_the_live_workers(kind: str) -> None:
    world = make_world(kind, 1)
    pool = [world.consumer(FakeGenerator(capacity=64, latency_s=3600), n, **FAST) for n in ("c1", "c2")]
    warm(pool)
    world.enqueue(group_jobs(["g0"], 10))
    for _ in range(3):
        for consumer in pool:
            consumer.guarded(consumer.step)
            time.sleep(0.02)  # simulated latency: time passes between the consumers' steps
    assert [c.held for c in pool] == [5, 5]  # a fair share each, though one could hold all 10


def test_heartbeat_reports_tokens_and_prefix_keys(kind: str) -> None:
    world = make_world(kind, P)
    consumer = world.consumer(FakeGenerator(capacity=8), "c1", **FAST)
    jobs = group_jobs(["g0", "g1", "g2"], 4)
    world.enqueue(jobs)
    run_until([consumer], world, len(jobs))
    time.sleep(0.03)  # simulated latency: the next heartbeat falls due
    consumer.guarded(consumer.step)
    beat = consumer.tally
    assert beat.prompt_tokens == sum(
        len(job.prompt.split()) for job in jobs if job.prompt
    )  # the fake's count
    assert beat.prefix_keys == 3 and beat.cached_tokens == 0


def test_prefix_tally_keeps_the_latest_distinct_keys() -> None:
    tally = PrefixTally(kept=3)
    for key in ["a", "b", "a", "c", "d", "a"]:
        tally.saw(key, 10, 4)
    assert (tally.prefix_keys, tally.prompt_tokens, tally.cached_tokens) == (3, 60, 24)


def test_a_prompt_list_job_is_keyed_by_its_first_prompt() -> None:
    """Jobs with ``prompts`` (a completions request with a prompt list) are grouped by their
    first prompt's start like prompt jobs; before, every such job had the same key (the empty
    token list's), so all of them went to one partition and one worker."""
    first = Job(id="a", prompts=["alpha " * 60, "beta"])
    same_start = Job(id="b", prompts=["alpha " * 60 + "then other", "gamma"])
    other = Job(id="c", prompts=["delta", "beta"])
    assert prefix_key(first) == prefix_key(same_start) != prefix_key(other)
    assert prefix_key(first) == prefix_key(Job(id="d", prompt="alpha " * 60))
