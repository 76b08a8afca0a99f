"""`radixq status` and a worker killed with kill -9: it is marked dead (holding its jobs) once
it missed its heartbeats, its jobs go to a live worker, and the live worker's housekeeping
removes it from the listing once it holds nothing."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import redis

from producer.client import Client
from tests.integration.procs import radixq, start_worker
from tests.waiting import wait_until
from wire.keys import QueueKeys
from wire.schema import Job
from wire.status import read_status

pytestmark = pytest.mark.integration

FAST = {"RADIXQ_HEARTBEAT_S": "0.2", "RADIXQ_HOUSEKEEPING_S": "0.5", "RADIXQ_MIN_IDLE_S": "1"}


def consumers(redis_url: str) -> dict[str, dict]:
    """What `status --json` lists per consumer (read in-process: the waits poll it often)."""
    raw = redis.Redis.from_url(redis_url)
    try:
        return {c["name"]: c for c in read_status(raw, QueueKeys()).to_dict()["consumers"]}
    finally:
        raw.close()


def test_killed_worker_is_marked_dead_then_forgotten_once_it_holds_nothing(
    redis_url: str, tmp_path: Path
) -> None:
    client = Client.from_url(redis_url, "default")
    try:
        client.enqueue([Job(id=f"k{i}", prompt="x") for i in range(12)])
    finally:
        client.close()
    keys, raw = QueueKeys(), redis.Redis.from_url(redis_url)
    doomed = start_worker(
        redis_url, "doomed", tmp_path / "d.log", RADIXQ_FAKE_LATENCY_S="60", RADIXQ_FAKE_CAPACITY="4", **FAST
    )
    wait_until(lambda: consumers(redis_url).get("doomed", {}).get("in_flight") == 4, "doomed holds 4 jobs")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    wait_until(lambda: not consumers(redis_url)["doomed"]["alive"], "doomed marked dead")
    text = radixq("status", "--redis-url", redis_url).stdout
    assert re.search(r"consumer doomed: dead: last heartbeat \d+ s ago, idle \d+ s, holds 4 jobs", text), text

    start_worker(redis_url, "live", tmp_path / "l.log", RADIXQ_FAKE_LATENCY_S="0.05", **FAST)
    wait_until(lambda: raw.hlen(keys.done) == 12, "every job done, the dead worker's included")
    wait_until(lambda: set(consumers(redis_url)) == {"live"}, "the dead consumer forgotten")
    assert raw.hkeys(keys.workers) == [b"live"]

    def lists_the_live_worker_alone() -> bool:
        text = radixq("status", "--redis-url", redis_url).stdout
        return "consumer doomed" not in text and bool(re.search(r"consumer live: running, 0 in flight", text))

    # NOTE: polled: on a loaded box a heartbeat of the live worker (every 0.2 s here) can be late
    # enough for one listing to call it dead, as the liveness rule says it should
    wait_until(lists_the_live_worker_alone, "status to list the live worker alone, running")
