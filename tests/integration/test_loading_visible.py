"""A worker loading its model is visible (issue 32, defect 3): `radixq status` lists it as
loading from before the load starts (its heartbeat, with no consumer entry yet), and its
`/metrics` answers `radixq_worker_loading 1` instead of an empty page, then 0 once it runs.
The load is the fake generator's, which starts when the test creates a file; the oracles are
the real redis-server's workers hash (through status) and the Prometheus text parser."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from producer.client import Client
from producer.local_redis import free_port
from tests.integration.procs import radixq, start_worker
from tests.integration.test_metrics import samples
from tests.integration.test_status_liveness import FAST, consumers
from tests.waiting import wait_until
from wire.schema import Job

pytestmark = pytest.mark.integration


def scraped(port: int) -> dict[str, float] | None:
    """The samples /metrics serves now; None while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return samples(reply.read().decode())
    except (urllib.error.URLError, ConnectionError):
        return None


def test_a_loading_worker_is_listed_as_loading_and_its_metrics_say_so(redis_url: str, tmp_path: Path) -> None:
    client = Client.from_url(redis_url, "default")
    try:
        client.enqueue([Job(id="j0", prompt="x")])
    finally:
        client.close()
    loaded, log, port = tmp_path / "loaded", tmp_path / "w.log", free_port()
    worker = start_worker(
        redis_url, "slow", log, "--metrics-port", str(port), RADIXQ_FAKE_START_FILE=str(loaded), **FAST
    )
    wait_until(lambda: scraped(port) is not None, "/metrics to answer", log)
    assert scraped(port) == {"radixq_worker_loading": 1.0}  # nothing else is known while loading
    wait_until(lambda: "slow" in consumers(redis_url), "status to list the loading worker", log)
    listed = consumers(redis_url)["slow"]
    assert listed["alive"] and listed["heartbeat"]["state"] == "loading" and listed["in_flight"] == 0
    text = radixq("status", "--redis-url", redis_url).stdout
    assert re.search(r"consumer slow: loading, 0 in flight", text), text

    loaded.touch()
    wait_until(lambda: consumers(redis_url)["slow"]["heartbeat"]["state"] == "running", "running", log)
    wait_until(lambda: (scraped(port) or {}).get("radixq_worker_loading") == 0.0, "loading 0", log)
    assert "radixq_jobs_started_total" in (scraped(port) or {})
    worker.terminate()
    assert worker.wait(timeout=60) == 0
