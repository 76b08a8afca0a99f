"""Redis crashing and coming back (same port, AOF on) loses nothing: workers reconnect with
backoff, held results wait in their outboxes, and every job completes exactly once."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.collector import Collector
from producer.keys import QueueKeys
from producer.local_redis import LocalRedis
from producer.schema import Job
from tests.conftest import require_redis_server
from tests.fake_generator import fake_text
from tests.integration.procs import start_worker

pytestmark = pytest.mark.integration

NUM_JOBS = 400


def test_redis_restart_loses_nothing(tmp_path: Path) -> None:
    require_redis_server()
    server = LocalRedis(use_server=True, data_dir=tmp_path, appendonly=True).start()
    keys = QueueKeys()
    workers = []
    try:
        client = Client.from_url(server.url)
        jobs = [Job(id=f"r{i:03d}", prompt=f"p {i}") for i in range(NUM_JOBS)]
        client.enqueue(jobs)
        env = {"RADIXQ_FAKE_CAPACITY": "8", "RADIXQ_FAKE_LATENCY_S": "0.03"}
        workers = [start_worker(server.url, f"w{i}", tmp_path / f"w{i}.log", **env) for i in range(2)]
        deadline = time.monotonic() + 60
        while client.redis.hlen(keys.done) < NUM_JOBS // 4:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.kill()
        time.sleep(1.5)  # workers run into a dead socket, back off, keep finishing held jobs
        server.restart()
        done_after_restart = client.redis.hlen(keys.done)
        assert done_after_restart >= NUM_JOBS // 4  # the AOF kept every acknowledged completion

        out = tmp_path / "out.jsonl"
        report = Collector(client.redis).collect(out, wait=True, timeout_s=90)
        assert report.missing == []
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for i, proc in enumerate(workers):
            assert proc.wait(timeout=30) == 0, (tmp_path / f"w{i}.log").read_text()[-3000:]
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.kill()
        server.stop()

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [job.id for job in jobs]
    assert all(row["error"] is None and row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)
    logs = "".join((tmp_path / f"w{i}.log").read_text() for i in range(2))
    assert "queue unavailable" in logs  # the workers did see the outage


def test_private_redis_restart_keeps_stream_and_group(tmp_path: Path) -> None:
    """The fixture itself: kill -9 then restart on the same port keeps the data (AOF always)."""
    require_redis_server()
    with LocalRedis(use_server=True, data_dir=tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        client.xgroup_create("s", "g", id="0", mkstream=True)
        client.xadd("s", {"a": "1"})
        client.close()
        server.kill()
        server.restart()
        client = redis.Redis.from_url(server.url)
        assert client.xlen("s") == 1
        assert client.xinfo_groups("s")[0]["name"] == b"g"
        client.close()
