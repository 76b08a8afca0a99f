"""A worker and ``radixq cancel``: cancelled jobs are never run, held ones are aborted, and their
entries are only acknowledged - on both queues (in memory, and Redis through fakeredis with the
real canceller, producer.cancel). The fake generator records what it ran and what it aborted."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fake_generator import FakeGenerator
from tests.unit.queue_worlds import World, make_world
from tests.waiting import LIVENESS_S, drive_until
from wire.schema import Job
from worker.queue.consumer import Consumer


@pytest.fixture(params=["memory", "redis"])
def world(request: pytest.FixtureRequest) -> World:
    return make_world(request.param)


def jobs_of(count: int) -> list[Job]:
    return [Job(id=f"j{i}", prompt=f"prompt {i}") for i in range(count)]


def step_while(consumers: list[Consumer], busy: Callable[[], bool], what: str) -> None:
    drive_until(lambda: not busy(), lambda: [consumer.guarded(consumer.step) for consumer in consumers], what)


def assert_cancelled_once(world: World, ids: list[str]) -> None:
    found = world.results_by_id()
    for job_id in ids:
        (result,) = found[job_id]
        assert result.error is not None and result.error.code == "cancelled", result
    assert {i: world.failed()[i] for i in ids} == dict.fromkeys(ids, "cancelled")


def test_held_jobs_that_are_cancelled_are_aborted_and_only_acknowledged(world: World) -> None:
    jobs = jobs_of(6)
    ids = [job.id for job in jobs]
    world.enqueue(jobs)
    generator = FakeGenerator(capacity=6, latency_s=10 * LIVENESS_S)  # finishes nothing by itself
    consumer = world.consumer(generator, heartbeat_s=0)  # looks at the cancel count every step
    step_while([consumer], lambda: consumer.held < 6, "six jobs held")
    world.cancel(ids[:3])
    step_while([consumer], lambda: world.pending() > 3, "the three cancelled entries acknowledged")
    assert sorted(generator.aborted) == ids[:3]
    assert consumer.held == 3 and consumer.completed == 0
    assert_cancelled_once(world, ids[:3])
    assert sorted(world.results_by_id()) == ids[:3]  # the aborted answers were not written
    world.cancel(ids)
    step_while([consumer], lambda: world.pending() > 0, "every entry acknowledged")
    assert sorted(generator.aborted) == ids and consumer.held == 0
    assert_cancelled_once(world, ids)


def test_a_job_cancelled_before_a_worker_reads_it_is_never_run(world: World) -> None:
    jobs = jobs_of(8)
    ids = [job.id for job in jobs]
    world.enqueue(jobs)
    world.cancel(ids[:4])
    generator = FakeGenerator(capacity=8)
    consumer = world.consumer(generator)
    step_while([consumer], lambda: world.done() < 8 or world.pending() > 0, "all eight answered")
    assert sorted(generator.submitted) == ids[4:]
    assert_cancelled_once(world, ids[:4])
    found = world.results_by_id()
    assert all(len(found[i]) == 1 and found[i][0].error is None for i in ids[4:])


def test_a_reclaimed_cancelled_job_is_not_run(world: World) -> None:
    """A worker dies holding jobs; they are cancelled; the worker that reclaims them runs none."""
    jobs = jobs_of(4)
    ids = [job.id for job in jobs]
    world.enqueue(jobs)
    doomed = FakeGenerator(capacity=4, latency_s=10 * LIVENESS_S)
    first = world.consumer(doomed, name="first", min_idle_s=0.05)
    step_while([first], lambda: first.held < 4, "four jobs held by the first worker")
    world.cancel(ids)  # the first worker never steps again: it died
    fresh = FakeGenerator(capacity=4)
    second = world.consumer(fresh, name="second", min_idle_s=0.05)
    step_while([second], lambda: world.pending() > 0, "the dead worker's entries reclaimed and acknowledged")
    assert fresh.submitted == []
    assert_cancelled_once(world, ids)
