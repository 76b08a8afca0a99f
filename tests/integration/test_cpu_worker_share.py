"""A CPU worker (real engine, SmolLM2, `--device cpu`, nothing else configured) holds only
as many jobs as its CPU-sized limit, so a 100-job queue stays available to sibling workers."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import redis

from tests.integration.procs import radixq, start_engine_worker
from tests.jobs_stream import pending_count
from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import LIVENESS_S, observe, wait_until
from wire.keys import QueueKeys
from worker.config import CPU_DEFAULTS
from worker.queue.consumer import HELD_PER_SLOT

pytestmark = [pytest.mark.integration, pytest.mark.model]
KEYS = QueueKeys()


def test_a_cpu_worker_does_not_take_a_whole_queue(
    redis_url: str,
    tmp_path: Path,
    smollm2_dir: Path,  # noqa: F811
) -> None:
    source = tmp_path / "jobs.jsonl"
    jobs = [
        {"id": f"j{i}", "prompt": f"Story {i}:", "max_tokens": 64, "ignore_eos": True} for i in range(100)
    ]
    source.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    assert radixq("enqueue", str(source), "--redis-url", redis_url).returncode == 0
    client = redis.Redis.from_url(redis_url)
    worker = start_engine_worker(redis_url, smollm2_dir, tmp_path / "worker.log", name="cpu1")
    limit = CPU_DEFAULTS["engine.max_running_reqs"]
    most_held = 0
    try:

        def held_now() -> int:
            nonlocal most_held
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            held = pending_count(client, KEYS)  # over every partition stream (a new queue routes)
            most_held = max(most_held, held)
            return held

        wait_until(held_now, "the worker to take jobs", tmp_path / "worker.log", poll_s=0.1)
        observe(held_now, duration_s=5.0)  # what it holds, sampled over 5 s of its run
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=LIVENESS_S)
        client.close()
    assert 0 < most_held <= HELD_PER_SLOT * limit < 100
