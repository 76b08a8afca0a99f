"""The consumer's policy, stepped by hand with the fake generator, on both queues: the
in-memory one and the Redis one (fakeredis). Redis-only behaviour is in test_consumer_redis.py."""

from __future__ import annotations

import logging
import re

import msgspec
import pytest

from tests.fake_generator import FakeGenerator, fake_text, fake_token_ids
from tests.unit.queue_worlds import MemoryWorld, World, config_for, make_world, step_until
from tests.waiting import drive_until
from wire.schema import Job, Result, SamplingParams, encode_job
from worker.frontend.contract import ENGINE_CRASH
from worker.queue.config import ConsumerConfig
from worker.queue.consumer import Consumer
from worker.queue.jobqueue import Completion
from worker.queue.outbox import Outbox


@pytest.fixture(params=["memory", "redis"])
def world(request: pytest.FixtureRequest) -> World:
    return make_world(request.param)


def make_jobs(count: int, prefix: str = "j", **sampling: object) -> list[Job]:
    params = SamplingParams(**sampling)  # type: ignore[arg-type]
    return [Job(id=f"{prefix}{i}", prompt=f"prompt {i}", sampling=params) for i in range(count)]


def test_all_jobs_complete_with_expected_results_and_metadata(world: World) -> None:
    jobs = [
        Job(id=f"m{i}", prompt="a b c", metadata={"row": i}, sampling=SamplingParams(n=2, max_tokens=3))
        for i in range(20)
    ]
    world.enqueue(jobs)
    consumer = world.consumer(FakeGenerator(capacity=4))
    step_until([consumer], 20, world)
    found = world.results_by_id()
    assert sorted(found) == sorted(job.id for job in jobs)
    for job in jobs:
        (result,) = found[job.id]
        assert result.metadata == {"row": int(job.id[1:])}
        assert [c.text for c in result.choices] == [fake_text(job.id, 0), fake_text(job.id, 1)]
        assert result.choices[0].token_ids == fake_token_ids(job.id, 3)
        assert result.usage.prompt_tokens == 3
        assert result.worker == "c1" and result.model == "fake-model"
        assert result.timings.enqueued_at_ms <= result.timings.started_at_ms <= result.timings.finished_at_ms
    assert world.pending() == 0


def test_reads_no_more_than_the_generator_takes(world: World) -> None:
    """Backpressure: the consumer never holds more than the generator can run."""
    world.enqueue(make_jobs(30))
    generator = FakeGenerator(capacity=3, latency_s=0.01)
    consumer = world.consumer(generator)

    def step() -> None:
        consumer.step()
        assert world.pending() <= 3

    drive_until(lambda: world.done() >= 30, step, "30 done")
    assert generator.max_held == 3
    assert consumer.held == 0


def test_read_window_caps_what_one_worker_holds(world: World) -> None:
    world.enqueue(make_jobs(20))
    generator = FakeGenerator(capacity=64, latency_s=0.01)
    consumer = world.consumer(generator, read_window=3)

    def step() -> None:
        consumer.step()
        assert world.pending() <= 3

    drive_until(lambda: world.done() >= 20, step, "20 done")
    assert generator.max_held == 3


def test_invalid_job_gets_error_result_once(world: World) -> None:
    world.enqueue(make_jobs(2))
    world.add_raw(
        "bad", msgspec.msgpack.encode({"id": "bad", "prompt": "x", "sampling": {"top_p": 7.0}, "v": 1})
    )
    consumer = world.consumer(FakeGenerator())
    step_until([consumer], 3, world)
    (error,) = world.results_by_id()["bad"]
    assert error.error is not None and error.error.code == "invalid_job"
    assert "sampling.top_p=7.0: must be in (0, 1]" in error.error.message
    assert world.failed()["bad"] == "invalid_job"
    assert world.dead() == []


def test_generator_error_result_is_recorded_as_failed(world: World) -> None:
    world.enqueue([Job(id="boom", prompt="x", metadata={"fake_error": "prompt_too_long"})])
    consumer = world.consumer(FakeGenerator())
    step_until([consumer], 1, world)
    assert world.failed() == {"boom": "prompt_too_long"}


def test_completed_job_is_not_run_again(world: World) -> None:
    """Idempotent by job id: a second entry for a done job is acknowledged, not run."""
    (job,) = make_jobs(1)
    world.enqueue([job])
    generator = FakeGenerator()
    consumer = world.consumer(generator)
    step_until([consumer], 1, world)
    world.add_raw(job.id, encode_job(job))
    for _ in range(5):
        consumer.step()
    assert generator.submitted == [job.id]
    assert len(world.results_by_id()[job.id]) == 1
    assert world.pending() == 0


def test_second_entry_of_a_running_job_is_acked_with_its_result(world: World) -> None:
    (job,) = make_jobs(1)
    world.enqueue([job])
    generator = FakeGenerator(latency_s=0.2)
    consumer = world.consumer(generator)
    consumer.step()
    assert consumer.held == 1
    world.add_raw(job.id, encode_job(job))
    step_until([consumer], 1, world)
    assert generator.submitted == [job.id]
    assert len(world.results_by_id()[job.id]) == 1
    assert world.pending() == 0


def test_lease_renewal_keeps_a_long_job_from_being_reclaimed(world: World) -> None:
    world.enqueue(make_jobs(1))
    slow = world.consumer(FakeGenerator(latency_s=0.6), "slow", min_idle_s=0.15)
    other_generator = FakeGenerator()
    other = world.consumer(other_generator, "other", min_idle_s=0.15)
    step_until([slow, other], 1, world)
    assert other_generator.submitted == []  # never reclaimed although the job ran 4x min_idle
    (result,) = world.results_by_id()["j0"]
    assert result.worker == "slow"


def test_drain_releases_unfinished_jobs_to_other_workers(world: World) -> None:
    world.enqueue(make_jobs(6))
    generator = FakeGenerator(capacity=6, latency_s=30)
    leaving = world.consumer(generator, "leaving", drain_timeout_s=0.2)
    leaving.step()
    assert leaving.held == 6
    leaving.request_stop()
    leaving.drain()  # NOTE: returns after drain_timeout_s, not after the jobs' 30 s
    assert world.pending() == 0 and generator.closed
    staying = world.consumer(FakeGenerator(), "staying")
    step_until([staying], 6, world)
    assert {r.worker for rs in world.results_by_id().values() for r in rs} == {"staying"}


def test_queue_outage_keeps_results_and_resumes(world: World) -> None:
    world.enqueue(make_jobs(10))
    consumer = world.consumer(FakeGenerator(capacity=10, latency_s=0.05), max_backoff_s=0.05)
    consumer.step()
    assert consumer.held == 10
    world.outage(True)
    failures = 0

    def step() -> None:
        nonlocal failures
        failures += not consumer.guarded(consumer.step)

    drive_until(
        lambda: failures and consumer.held == 0 and len(consumer.outbox) == 10,
        step,
        lambda: (
            f"10 results kept in the outbox (failures {failures}, held {consumer.held}, {len(consumer.outbox)} kept)"
        ),
    )
    # the steps failed (the queue was away) and the jobs finished meanwhile, kept in the outbox
    world.outage(False)
    step_until([consumer], 10, world)
    assert len(consumer.outbox) == 0
    assert len(world.results_by_id()) == 10


def test_engine_crash_counts_attempts_then_dead_letters_the_culprit(world: World) -> None:
    poison = Job(id="poison", prompt="x", metadata={"fake_error": ENGINE_CRASH})
    world.enqueue([*make_jobs(3), poison])
    generator = FakeGenerator()
    consumer = world.consumer(generator, max_attempts=3)
    step_until([consumer], 4, world)
    assert generator.submitted.count("poison") == 3  # run, then twice more (attempts 2 and 3)
    ((job_id, reason, attempts),) = world.dead()
    assert job_id == "poison" and attempts == 4
    assert "crashed the engine 3 times when it ran alone (max_attempts=3)" in reason
    found = world.results_by_id()
    assert [r.error.code for r in found["poison"] if r.error] == ["dead_letter"]
    assert all(found[f"j{i}"][0].ok for i in range(3))
    assert world.pending() == 0


def test_a_surprise_while_taking_one_entry_in_fails_that_entry_only(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    import worker.queue.held as held_module

    real = held_module.decode_entry

    def exploding(entry):  # type: ignore[no-untyped-def]
        if entry.job_id == "j1":
            raise RuntimeError("boom")
        return real(entry)

    monkeypatch.setattr(held_module, "decode_entry", exploding)
    world.enqueue(make_jobs(4))
    consumer = world.consumer(FakeGenerator())
    step_until([consumer], 4, world)
    found = world.results_by_id()
    error = found["j1"][0].error
    assert error is not None and error.code == "internal" and "RuntimeError: boom" in error.message
    assert all(found[f"j{i}"][0].ok for i in (0, 2, 3))


def test_a_result_that_cannot_be_encoded_becomes_an_internal_error(world: World) -> None:
    consumer = world.consumer(FakeGenerator())
    consumer.queue.prepare()
    outbox = Outbox()
    outbox.add(Completion(Result(id="big", metadata={"n": 2**70}), "1-0"))  # msgpack has no such integer
    outbox.add(Completion(Result(id="fine", metadata={"n": 1}), "2-0"))
    assert outbox.flush(consumer.queue) == 2
    found = world.results_by_id()
    assert found["big"][0].error is not None and found["big"][0].error.code == "internal"
    assert "could not be encoded" in found["big"][0].error.message
    assert found["fine"][0].metadata == {"n": 1}


def test_a_queue_that_loses_its_data_is_reported(world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.enqueue(make_jobs(2))
    consumer = world.consumer(FakeGenerator(), heartbeat_s=0.0)
    step_until([consumer], 2, world)
    assert consumer.data_losses == 0
    world.lose_everything()  # what a Redis restarted without persistence looks like
    with caplog.at_level(logging.ERROR, logger="radixq.worker"):
        for _ in range(3):
            consumer.guarded(consumer.step)
    assert consumer.data_losses == 1
    assert "DATA LOSS" in caplog.text and "Re-enqueue the input file" in caplog.text
    world.enqueue(make_jobs(2, prefix="k"))  # a new epoch: no second report
    step_until([consumer], 2, world)
    assert consumer.data_losses == 1


@pytest.mark.parametrize("bad", [{"min_idle_s": 0}, {"max_attempts": 0}, {"read_window": -1}])
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConsumerConfig(**bad)  # type: ignore[arg-type]


def test_served_model_names_refuse_jobs_naming_another_model() -> None:
    """A worker given served model names answers a job naming another model with a
    model_not_served error (metadata kept, so an OpenAI line is written back as one); jobs
    naming a served model, or none, run."""
    world = MemoryWorld()
    jobs = [
        Job(id="served", prompt="a", model="smol"),
        Job(id="unnamed", prompt="a"),
        Job(id="other", prompt="a", model="gpt-4o", metadata={"row": 1}),
    ]
    world.enqueue(jobs)
    config = config_for("c1")
    queue = world.store.queue("c1", config.min_idle_s)
    consumer = Consumer(queue, FakeGenerator(capacity=4), config, served_models=("smol", "smollm2"))
    step_until([consumer], 3, world)
    found = {job_id: results[0] for job_id, results in world.results_by_id().items()}
    assert found["served"].ok and found["unnamed"].ok
    error = found["other"].error
    assert error is not None and error.code == "model_not_served"
    assert "'gpt-4o'" in error.message and "'smol'" in error.message and "'other'" in error.message
    assert found["other"].metadata == {"row": 1}


def _lose_queue(world: World) -> None:
    """Redis restarted empty: no jobs, no results, no epoch (the memory store forgets its own)."""
    world.lose_everything()
    if isinstance(world, MemoryWorld):
        world.store.epoch = None


def test_results_of_jobs_read_before_the_queue_was_lost_are_dropped(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Jobs held when Redis lost the queue: their results are not written into the emptied
    queue (DATA LOSS, counted), and once the same jobs are enqueued again they run again and
    each gets one result."""
    jobs = make_jobs(3)
    world.enqueue(jobs)
    consumer = world.consumer(FakeGenerator(capacity=3, latency_s=0.2), heartbeat_s=60.0)
    consumer.step()
    assert consumer.held == 3
    _lose_queue(world)
    with caplog.at_level(logging.ERROR, logger="radixq.worker"):
        drive_until(
            lambda: not (consumer.held or len(consumer.outbox)),
            lambda: consumer.guarded(consumer.step),
            "the held jobs and the outbox to empty",
        )
    assert world.results_by_id() == {} and world.done() == 0
    assert consumer.outbox.dropped == 3
    # NOTE: on a loaded machine the three jobs may finish in different steps: one line a flush
    logged = re.findall(r"DATA LOSS: dropped (\d+) results", caplog.text)
    assert logged and sum(map(int, logged)) == 3, caplog.text
    world.enqueue(jobs)
    step_until([consumer], 3, world)
    assert {job_id: len(rs) for job_id, rs in world.results_by_id().items()} == {j.id: 1 for j in jobs}
    assert world.pending() == 0


def test_a_job_enqueued_again_after_the_loss_answers_its_new_entry(world: World) -> None:
    """A job still running when the queue was lost, enqueued again and read again before it
    finished: its run answers the new entry, once."""
    jobs = make_jobs(2)
    world.enqueue(jobs[:1])
    generator = FakeGenerator(capacity=2, latency_s=0.3)
    consumer = world.consumer(generator, heartbeat_s=60.0)
    consumer.step()
    assert consumer.held == 1
    _lose_queue(world)
    world.enqueue(jobs)  # NOTE: two, so that the fair share lets it read j0 while it runs
    step_until([consumer], 2, world)
    for job in jobs:
        (result,) = world.results_by_id()[job.id]
        assert result.ok and result.choices[0].text == fake_text(job.id)
    assert generator.submitted == ["j0", "j1"]  # j0 ran once, for both entries
    assert world.pending() == 0 and consumer.outbox.dropped == 0


def test_a_drain_does_not_give_back_jobs_of_a_lost_queue(world: World) -> None:
    world.enqueue(make_jobs(2))
    consumer = world.consumer(FakeGenerator(capacity=2, latency_s=30), drain_timeout_s=0.2, heartbeat_s=60.0)
    consumer.step()
    assert consumer.held == 2
    _lose_queue(world)
    consumer.request_stop()
    consumer.drain()
    assert world.pending() == 0
    staying = world.consumer(FakeGenerator(), "staying")
    for _ in range(5):
        staying.guarded(staying.step)
    assert world.results_by_id() == {}  # nothing was put back to run


def test_the_consumer_alone_fills_the_envelope() -> None:
    """A generator's result carries choices, usage, an error and the first token; whatever else
    it says, the written result has the job's metadata, this worker, the model named, and
    timings from enqueue through this worker's taking of the job to now."""
    from wire.schema import Timings
    from worker.queue.held import envelope

    job = Job(id="e", prompt="x", metadata={"row": 7}, enqueued_at_ms=100)
    claimed = Result(
        id="e",
        metadata={"other": 1},
        worker="elsewhere",
        timings=Timings(enqueued_at_ms=1, started_at_ms=2, finished_at_ms=3, first_token_at_ms=250),
    )
    filled = envelope(claimed, job, 200, "w1", "m")
    assert (filled.metadata, filled.worker, filled.model) == ({"row": 7}, "w1", "m")
    timings = filled.timings
    assert (timings.enqueued_at_ms, timings.started_at_ms, timings.first_token_at_ms) == (100, 200, 250)
    assert timings.finished_at_ms >= 250
