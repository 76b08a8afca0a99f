"""collect's spill against a real redis-server: a kill -9 at each point of a round loses and
repeats nothing, a signal keeps everything read and removes the lock, and a collect started
while Redis is down waits for it.

Results are written by hand the way a worker's outbox does (tests/integration/results.py), so
every expected row is known independently; the collects are `radixq collect` subprocesses
(tests/integration/crashing_collect.py kills one with SIGKILL at a chosen point)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.local_redis import LocalRedis
from tests.conftest import require_redis_server
from tests.integration.procs import REPO_ROOT, radixq, start_radixq, subprocess_env
from tests.integration.results import complete, complete_all, spilled
from tests.waiting import LIVENESS_S, wait_until
from wire import exits
from wire.keys import QueueKeys
from wire.schema import Job

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def enqueue(url: str, count: int) -> list[str]:
    ids = [f"k{i:03d}" for i in range(count)]
    client = Client.from_url(url)
    client.enqueue([Job(id=job_id, prompt=f"prompt {job_id}") for job_id in ids])
    client.close()
    return ids


def crashing_collect(point: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.integration.crashing_collect", point, "collect", *args],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=LIVENESS_S,
    )


def assert_complete(out: Path, ids: list[str]) -> None:
    """Every id once, in order, each row the result written for it; nothing left behind."""
    written = rows(out)
    assert [row["id"] for row in written] == ids
    assert all(row["choices"][0]["text"] == f"t {row['id']}" for row in written)
    assert spilled(out) == [] and not out.with_name(out.name + ".spill").exists()
    assert not out.with_name(out.name + ".lock").exists()


@pytest.mark.parametrize("point", ["spilled", "trimmed", "appended"])
def test_kill_9_anywhere_in_a_round_loses_and_repeats_nothing(
    point: str, redis_url: str, tmp_path: Path
) -> None:
    ids = enqueue(redis_url, 60)
    client = redis.Redis.from_url(redis_url)
    complete_all(client, ids[:10] + ids[11:])  # k010 missing: k011.. arrive ahead of it
    out = tmp_path / "out.jsonl"
    crashed = crashing_collect(point, "-o", str(out), "--redis-url", redis_url, "--no-wait")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    # What the crash left: the spill committed the whole chunk in every case...
    assert spilled(out) == sorted(ids[:10] + ids[11:])
    # ...the results stream was trimmed past it unless the crash came first...
    assert client.xlen(KEYS.results) == (59 if point == "spilled" else 0)
    # ...and the rows due (k000..k009) are in the output only once appended.
    assert [row["id"] for row in rows(out)] == (ids[:10] if point == "appended" else [])

    complete(client, ids[10])
    done = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert done.returncode == exits.OK, done.stderr
    assert_complete(out, ids)
    assert client.xlen(KEYS.results) == 0
    client.close()


def test_kill_9_while_replacing_a_requeued_row(redis_url: str, tmp_path: Path) -> None:
    ids = enqueue(redis_url, 5)
    client = redis.Redis.from_url(redis_url)
    for job_id in ids:
        complete(client, job_id, error="dead_letter" if job_id == "k002" else None)
    out = tmp_path / "out.jsonl"
    first = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert first.returncode == exits.JOBS_FAILED and rows(out)[2]["error"]["code"] == "dead_letter"
    queue = Client(client)
    assert queue.requeue_dead(["k002"]) == ["k002"]
    complete(client, "k002")
    crashed = crashing_collect("replaced", "-o", str(out), "--redis-url", redis_url)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert spilled(out) == ["k002"]  # replaced in the output, not yet let go of
    again = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert again.returncode == exits.OK, again.stderr
    assert_complete(out, ids)
    client.close()


def test_kill_9_while_putting_the_file_in_order(redis_url: str, tmp_path: Path) -> None:
    """An output left out of order (as an interrupted `run` leaves it) is put in order by the
    collect that completes it; killed before the rename, the file is still whole."""
    ids = enqueue(redis_url, 20)
    client = redis.Redis.from_url(redis_url)
    complete_all(client, ids)
    out = tmp_path / "out.jsonl"
    assert (
        radixq("collect", "-o", str(out), "--redis-url", redis_url, "--keep-results").returncode == exits.OK
    )
    out.write_text("".join(reversed(out.read_text().splitlines(keepends=True))))
    crashed = crashing_collect("reordered", "-o", str(out), "--redis-url", redis_url)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert [row["id"] for row in rows(out)] == ids[::-1]
    again = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert again.returncode == exits.OK, again.stderr
    assert_complete(out, ids)
    client.close()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_keeps_everything_read_and_removes_the_lock(
    signum: signal.Signals, redis_url: str, tmp_path: Path
) -> None:
    """Issue 30, item 7: 161 of 300 results arrived, one job missing ahead of most of them.
    Ctrl-C (or SIGTERM) writes the rows due in order, keeps the rest in the spill (out of
    Redis), exits 128 + the signal and removes OUT.lock; the next collect writes the rest."""
    ids = enqueue(redis_url, 300)
    client = redis.Redis.from_url(redis_url)
    complete_all(client, ids[:10] + ids[11:161])
    out, log = tmp_path / "out.jsonl", tmp_path / "collect.log"
    proc = start_radixq(
        "collect", "-o", str(out), "--redis-url", redis_url, "--progress-interval", "0.1", log=log
    )
    try:
        wait_until(lambda: "160/300 done" in log.read_text(), "collect to read the 160 results", log)
        proc.send_signal(signum)
        assert proc.wait(timeout=LIVENESS_S) == 128 + signum, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text
    assert [row["id"] for row in rows(out)] == ids[:10]  # in order up to the first missing id
    assert spilled(out) == ids[11:161]  # the rest, kept for the resume...
    assert client.xlen(KEYS.results) == 0  # ...and out of Redis
    assert not (tmp_path / "out.jsonl.lock").exists()
    assert "interrupted: wrote 10 results" in text and "150 results read behind a job still missing" in text

    complete_all(client, ids[10:11] + ids[161:])
    done = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert done.returncode == exits.OK, done.stderr
    assert_complete(out, ids)
    client.close()


def test_collect_started_while_redis_is_down_waits_for_it(tmp_path: Path) -> None:
    """Issue 30, item 4: Redis down when collect starts, back 3 s later (same port, AOF):
    collect waits for it within --retry-timeout-s and completes (rc 0)."""
    require_redis_server()
    server = LocalRedis(use_server=True, data_dir=tmp_path, appendonly=True).start()
    try:
        ids = enqueue(server.url, 50)
        client = redis.Redis.from_url(server.url)
        complete_all(client, ids)
        client.close()
        server.stop(cleanup=False)
        out, log = tmp_path / "out.jsonl", tmp_path / "collect.log"
        proc = start_radixq(
            "collect", "-o", str(out), "--redis-url", server.url, "--retry-timeout-s", "60", log=log
        )
        try:
            wait_until(lambda: "waiting for Redis (up to 60 s)" in log.read_text(), "collect to wait", log)
            time.sleep(3)  # simulated outage: Redis stays down 3 s (the scenario)
            server.restart()
            assert proc.wait(timeout=LIVENESS_S) == exits.OK, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert "Redis answers again" in log.read_text()
        assert_complete(out, ids)
    finally:
        server.stop(cleanup=False)
