"""The queue consumer against fakeredis with the fake backend, stepped by hand."""

from __future__ import annotations

import time
from pathlib import Path

import fakeredis
import msgspec
import pytest

from producer.client import Client
from producer.collector import Collector
from producer.keys import FIELD_ID, FIELD_JOB, QueueKeys
from producer.schema import Job, SamplingParams, decode_result, encode_job
from tests.fake_backend import FakeBackend, fake_text, fake_token_ids
from worker.queue.config import ConsumerConfig
from worker.queue.consumer import Consumer

KEYS = QueueKeys()


def make_jobs(count: int, prefix: str = "j", **sampling: object) -> list[Job]:
    params = SamplingParams(**sampling)  # type: ignore[arg-type]
    return [Job(id=f"{prefix}{i}", prompt=f"prompt {i}", sampling=params) for i in range(count)]


def consumer_for(
    client: fakeredis.FakeRedis, backend: FakeBackend, name: str = "c1", **config: object
) -> Consumer:
    settings = {"name": name, "block_s": 0.01, "poll_s": 0.005, **config}
    return Consumer(client, backend, ConsumerConfig(**settings))  # type: ignore[arg-type]


def step_until(
    consumers: list[Consumer], done: int, client: fakeredis.FakeRedis, timeout_s: float = 20
) -> None:
    deadline = time.monotonic() + timeout_s
    while client.hlen(KEYS.done) < done:
        assert time.monotonic() < deadline, f"only {client.hlen(KEYS.done)} of {done} done"
        for consumer in consumers:
            consumer.guarded(consumer.step)


def results_by_id(client: fakeredis.FakeRedis) -> dict[str, list]:
    found: dict[str, list] = {}
    for _, fields in client.xrange(KEYS.results):
        result = decode_result(fields[b"result"])
        found.setdefault(result.id, []).append(result)
    return found


def test_all_jobs_complete_with_expected_results_and_metadata(fake_redis: fakeredis.FakeRedis) -> None:
    jobs = [
        Job(id=f"m{i}", prompt="a b c", metadata={"row": i}, sampling=SamplingParams(n=2, max_tokens=3))
        for i in range(20)
    ]
    Client(fake_redis).enqueue(jobs)
    consumer = consumer_for(fake_redis, FakeBackend(capacity=4))
    step_until([consumer], 20, fake_redis)
    found = results_by_id(fake_redis)
    assert sorted(found) == sorted(job.id for job in jobs)
    for job in jobs:
        (result,) = found[job.id]
        assert result.metadata == {"row": int(job.id[1:])}
        assert [c.text for c in result.choices] == [fake_text(job.id, 0), fake_text(job.id, 1)]
        assert result.choices[0].token_ids == fake_token_ids(job.id, 3)
        assert result.usage.prompt_tokens == 3
        assert result.worker == "c1" and result.model == "fake-model"
        assert result.timings.enqueued_at_ms <= result.timings.started_at_ms <= result.timings.finished_at_ms
    assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] == 0


def test_reads_no_more_than_backend_capacity(fake_redis: fakeredis.FakeRedis) -> None:
    """Backpressure: the consumer's pending list never exceeds what the backend can hold."""
    Client(fake_redis).enqueue(make_jobs(30))
    backend = FakeBackend(capacity=3, latency_s=0.01)
    consumer = consumer_for(fake_redis, backend)
    deadline = time.monotonic() + 20
    while fake_redis.hlen(KEYS.done) < 30:
        assert time.monotonic() < deadline
        consumer.step()
        assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] <= 3
    assert backend.max_held == 3
    assert consumer.held == 0


def test_invalid_job_gets_error_result_once(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(2))
    bad = msgspec.msgpack.encode({"id": "bad", "prompt": "x", "sampling": {"top_p": 7.0}, "v": 1})
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: "bad", FIELD_JOB: bad})
    consumer = consumer_for(fake_redis, FakeBackend())
    step_until([consumer], 3, fake_redis)
    found = results_by_id(fake_redis)
    (error,) = found["bad"]
    assert error.error is not None and error.error.code == "invalid_job"
    assert "sampling.top_p=7.0: must be in (0, 1]" in error.error.message
    assert fake_redis.hget(KEYS.failed, "bad") == b"invalid_job"
    assert fake_redis.xlen(KEYS.dead) == 0


def test_backend_error_result_is_recorded_as_failed(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue([Job(id="boom", prompt="x", metadata={"fake_error": "prompt_too_long"})])
    consumer = consumer_for(fake_redis, FakeBackend())
    step_until([consumer], 1, fake_redis)
    assert fake_redis.hget(KEYS.failed, "boom") == b"prompt_too_long"
    assert Client(fake_redis).status().failed == 1


def test_completed_job_is_not_run_again(fake_redis: fakeredis.FakeRedis) -> None:
    """Idempotent by job id: a second stream entry for a done job is acked, not run."""
    (job,) = make_jobs(1)
    Client(fake_redis).enqueue([job])
    backend = FakeBackend()
    consumer = consumer_for(fake_redis, backend)
    step_until([consumer], 1, fake_redis)
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: job.id, FIELD_JOB: encode_job(job)})
    for _ in range(5):
        consumer.step()
    assert backend.submitted == [job.id]
    assert fake_redis.xlen(KEYS.results) == 1
    assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] == 0


def test_dead_consumer_jobs_are_reclaimed_then_dead_lettered_and_requeued(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    client = Client(fake_redis)
    client.enqueue(make_jobs(3))
    # A consumer that reads and dies: delivery 1 of every job.
    fake_redis.xreadgroup(KEYS.group, "ghost", {KEYS.jobs: ">"}, count=10)
    time.sleep(0.06)
    # A second one reclaims and dies too: delivery 2.
    fake_redis.xautoclaim(KEYS.jobs, KEYS.group, "ghost2", 50, "0-0", count=10)
    time.sleep(0.06)
    consumer = consumer_for(fake_redis, FakeBackend(), min_idle_s=0.05, max_attempts=2)
    step_until([consumer], 3, fake_redis)
    assert fake_redis.xlen(KEYS.dead) == 3
    letters = client.dead_letters()
    assert sorted(letter.job_id for letter in letters) == ["j0", "j1", "j2"]
    assert all(
        letter.attempts == 3 and "delivered 3 times (max_attempts=2)" in letter.reason for letter in letters
    )
    status = client.status()
    assert (status.done, status.failed, status.dead_lettered, status.in_flight) == (3, 3, 3, 0)

    out = tmp_path / "out.jsonl"
    first = Collector(fake_redis).collect(out, wait=False)
    assert first.written == 3 and first.missing == []
    assert all('"dead_letter"' in line for line in out.read_text().splitlines())

    # Requeued, they run for real; a fresh collect counts the new results, not the dead letters.
    assert sorted(client.requeue_dead(["j0", "j2"])) == ["j0", "j2"]
    assert fake_redis.xlen(KEYS.dead) == 1
    step_until([consumer], 3, fake_redis)
    out2 = tmp_path / "out2.jsonl"
    Collector(fake_redis).collect(out2, wait=True, timeout_s=5)
    rows = {row["id"]: row for row in map(msgspec.json.decode, out2.read_text().splitlines())}
    assert rows["j0"]["error"] is None and rows["j2"]["error"] is None
    assert rows["j1"]["error"]["code"] == "dead_letter"


def test_lease_renewal_keeps_a_long_job_from_being_reclaimed(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(1))
    slow = consumer_for(fake_redis, FakeBackend(latency_s=0.6), "slow", min_idle_s=0.15)
    other_backend = FakeBackend()
    other = consumer_for(fake_redis, other_backend, "other", min_idle_s=0.15)
    step_until([slow, other], 1, fake_redis)
    assert other_backend.submitted == []  # never reclaimed although the job ran 4x min_idle
    (result,) = results_by_id(fake_redis)["j0"]
    assert result.worker == "slow"


def test_drain_releases_unfinished_jobs_to_other_workers(fake_redis: fakeredis.FakeRedis) -> None:
    Client(fake_redis).enqueue(make_jobs(6))
    leaving = consumer_for(fake_redis, FakeBackend(capacity=6, latency_s=30), "leaving", drain_timeout_s=0.2)
    leaving.step()
    assert leaving.held == 6
    leaving.request_stop()
    leaving.drain()
    assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] == 0
    assert leaving.backend.closed  # type: ignore[attr-defined]
    assert all(c["name"] != b"leaving" for c in fake_redis.xinfo_consumers(KEYS.jobs, KEYS.group))
    staying = consumer_for(fake_redis, FakeBackend(), "staying")
    step_until([staying], 6, fake_redis)
    assert {r.worker for rs in results_by_id(fake_redis).values() for r in rs} == {"staying"}


def test_connection_loss_keeps_results_and_reconnects() -> None:
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    Client(client).enqueue(make_jobs(10))
    backend = FakeBackend(capacity=10, latency_s=0.05)
    consumer = consumer_for(client, backend, max_backoff_s=0.05)
    consumer.step()
    assert consumer.held == 10
    server.connected = False
    failures = 0
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        failures += not consumer.guarded(consumer.step)
    assert failures > 0
    assert consumer.held == 0 and len(consumer.outbox) == 10  # finished while Redis was away
    server.connected = True
    step_until([consumer], 10, client)
    assert len(consumer.outbox) == 0
    assert client.xlen(KEYS.results) == 10


@pytest.mark.parametrize("bad", [{"min_idle_s": 0}, {"max_attempts": 0}])
def test_config_rejects_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ConsumerConfig(**bad)  # type: ignore[arg-type]


def test_second_entry_of_a_running_job_is_acked_with_its_result(fake_redis: fakeredis.FakeRedis) -> None:
    (job,) = make_jobs(1)
    Client(fake_redis).enqueue([job])
    backend = FakeBackend(latency_s=0.2)
    consumer = consumer_for(fake_redis, backend)
    consumer.step()
    assert consumer.held == 1
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: job.id, FIELD_JOB: encode_job(job)})
    step_until([consumer], 1, fake_redis)
    assert backend.submitted == [job.id]
    assert fake_redis.xlen(KEYS.results) == 1
    assert fake_redis.xpending(KEYS.jobs, KEYS.group)["pending"] == 0
