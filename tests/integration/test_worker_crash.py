"""A worker killed with SIGKILL mid-run loses nothing: the survivor reclaims its jobs."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from producer.client import Client
from producer.collector import Collector
from tests.fake_generator import fake_text
from tests.integration.procs import start_worker
from tests.jobs_stream import consumer_names, pending_count, pending_entries
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import QueueKeys
from wire.schema import Job, SamplingParams

pytestmark = pytest.mark.integration

NUM_JOBS = 500


def test_sigkill_worker_jobs_are_reclaimed_and_all_results_collected_once(
    redis_url: str, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url)
    keys = QueueKeys()
    jobs = [
        Job(id=f"job-{i:03d}", prompt=f"prompt number {i}", sampling=SamplingParams(max_tokens=4))
        for i in range(NUM_JOBS)
    ]
    assert len(client.enqueue(jobs).enqueued) == NUM_JOBS

    # 8 slots x 25 ms per job: ~320 jobs/s per worker, so the run takes a second or more.
    env = {"RADIXQ_FAKE_CAPACITY": "8", "RADIXQ_FAKE_LATENCY_S": "0.025", "RADIXQ_MIN_IDLE_S": "1.0"}
    victim = start_worker(redis_url, "victim", tmp_path / "victim.log", **env)
    survivor = None

    def stopped_holding_jobs() -> bool:
        """SIGSTOP the victim; True when it holds jobs, else it runs on (checked again)."""
        victim.send_signal(signal.SIGSTOP)
        if pending_entries(client.redis, keys, "victim"):
            return True
        victim.send_signal(signal.SIGCONT)
        return False

    try:
        # NOTE: the victim runs alone until it is stopped holding jobs: a survivor started beside
        # it could finish the queue first on a loaded box, and the kill would prove nothing.
        wait_until(
            lambda: client.redis.hlen(keys.done) >= NUM_JOBS // 10 and stopped_holding_jobs(),
            "the victim to hold jobs after a tenth of them",
            poll_s=0.05,
        )
        orphaned = {info["message_id"] for info in pending_entries(client.redis, keys, "victim")}
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=LIVENESS_S)
        survivor = start_worker(redis_url, "survivor", tmp_path / "survivor.log", **env)

        out = tmp_path / "out.jsonl"
        report = Collector(client.redis).collect(out, wait=True, timeout_s=LIVENESS_S)
        assert report.missing == []
    finally:
        if victim.poll() is None:
            victim.kill()
        if survivor is not None and survivor.poll() is None:
            survivor.send_signal(signal.SIGTERM)
    assert survivor is not None and survivor.wait(timeout=LIVENESS_S) == 0, (
        tmp_path / "survivor.log"
    ).read_text()[-3000:]

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [line["id"] for line in lines]
    assert ids == [job.id for job in jobs]  # every id exactly once, in enqueue order
    for line in lines:
        assert line["error"] is None
        assert line["choices"][0]["text"] == fake_text(line["id"])

    # The orphaned entries were completed by the survivor, and nothing is left pending.
    done = client.redis.hgetall(keys.done)
    orphan_results = [
        fields for _, fields in client.redis.xrange(keys.results) if fields[b"entry"].decode() in orphaned
    ]
    assert {fields[b"entry"].decode() for fields in orphan_results} == orphaned
    assert all(done[fields[b"id"]] == fields[b"entry"] for fields in orphan_results)
    assert pending_count(client.redis, keys) == 0
    assert client.redis.xlen(keys.dead) == 0
    survivor_log = (tmp_path / "survivor.log").read_text()
    assert "reclaimed" in survivor_log
    client.close()


def test_worker_drains_on_sigterm_and_exits_zero(redis_url: str, tmp_path: Path) -> None:
    """SIGTERM: the worker stops reading, finishes what it holds, leaves the group, exits 0."""
    client = Client.from_url(redis_url)
    keys = QueueKeys()
    client.enqueue([Job(id=f"d{i}", prompt="x") for i in range(200)])
    env = {"RADIXQ_FAKE_CAPACITY": "4", "RADIXQ_FAKE_LATENCY_S": "0.05"}
    worker = start_worker(redis_url, "drainer", tmp_path / "w.log", **env)
    wait_until(lambda: client.redis.hlen(keys.done) >= 8, "some jobs done")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=LIVENESS_S) == 0
    done = client.redis.hlen(keys.done)
    assert 8 <= done < 200
    # Nothing stays pending on the departed consumer; everything else is still queued.
    assert pending_count(client.redis, keys) == 0
    assert client.status().queued == 200 - done
    assert client.redis.hget(keys.workers, "drainer") is None
    assert b"drainer" not in consumer_names(client.redis, keys)
    client.close()
