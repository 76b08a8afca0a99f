"""Redis crashing and coming back (same port, AOF on) loses nothing: workers reconnect with
backoff, held results wait in their outboxes, and every job completes exactly once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.collector import Collector
from producer.local_redis import LocalRedis
from tests.conftest import require_redis_server
from tests.fake_generator import fake_text
from tests.integration.procs import radixq, start_worker
from tests.waiting import LIVENESS_S, observe, wait_until
from wire import exits
from wire.keys import QueueKeys
from wire.schema import Job
from wire.status import decode_heartbeat
from worker.queue.streams import RedisJobQueue
from worker.queue.streams.lag import LagCount
from worker.queue.streams.survey import take

pytestmark = pytest.mark.integration

NUM_JOBS = 400


def all_logged(folder: Path, workers: int, text: str) -> bool:
    """Whether each worker's log (w0.log, w1.log, ...) has ``text``."""
    return all(text in (folder / f"w{i}.log").read_text(errors="replace") for i in range(workers))


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
        wait_until(lambda: client.redis.hlen(keys.done) >= NUM_JOBS // 4, "a quarter of the jobs done")
        server.kill()
        # workers run into a dead socket, back off, keep finishing held jobs
        wait_until(lambda: all_logged(tmp_path, 2, "queue unavailable"), "both workers to meet the outage")
        server.restart()
        done_after_restart = client.redis.hlen(keys.done)
        assert done_after_restart >= NUM_JOBS // 4  # the AOF kept every acknowledged completion

        out = tmp_path / "out.jsonl"
        report = Collector(client.redis).collect(out, wait=True, timeout_s=90)
        assert report.missing == []
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for i, proc in enumerate(workers):
            assert proc.wait(timeout=LIVENESS_S) == 0, (tmp_path / f"w{i}.log").read_text()[-3000:]
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


def test_workers_keep_their_window_full_after_an_aof_restart(tmp_path: Path) -> None:
    """After kill -9 and a restart from the AOF, Redis cannot tell the group's lag (nil in
    XINFO GROUPS, checked here) while thousands of jobs are queued. The workers count it
    instead of reading 0, so their windows stay full: 2 workers of capacity 8 hold at least
    75% of 16 jobs, read from Redis as the group's pending entries delivered after the restart
    (entries whose delivery the kill cut off stay pending too, until reclaimed: not counted)."""
    require_redis_server()
    server = LocalRedis(use_server=True, data_dir=tmp_path, appendonly=True, fsync="always").start()
    keys = QueueKeys()
    workers = []
    try:
        client = Client.from_url(server.url, partitions=0)  # one stream: its group is read below
        jobs = [Job(id=f"r{i:04d}", prompt=f"p {i}") for i in range(5000)]
        client.enqueue(jobs)
        env = {
            "RADIXQ_FAKE_CAPACITY": "8",
            "RADIXQ_FAKE_LATENCY_S": "0.03",
            "RADIXQ_SURVEY_S": "0.2",
            "RADIXQ_MIN_IDLE_S": "2",  # NOTE: the cut-off deliveries come back soon, as in a long run
        }
        workers = [start_worker(server.url, f"w{i}", tmp_path / f"w{i}.log", **env) for i in range(2)]
        wait_until(lambda: client.redis.hlen(keys.done) >= 300, "300 jobs done before the kill")
        server.kill()
        wait_until(lambda: all_logged(tmp_path, 2, "queue unavailable"), "both workers to meet the outage")
        server.restart()
        group = client.redis.xinfo_groups(keys.jobs)[0]
        assert group["lag"] is None, group  # what the workers face: Redis lost the count
        boundary = group["last-delivered-id"].decode()
        restarted_s, done_then = time.monotonic(), client.redis.hlen(keys.done)
        wait_until(lambda: client.redis.hlen(keys.done) >= done_then + 1500, "1500 more jobs done")
        held: list[int] = []
        observe(  # what the workers hold past the boundary, over 2 s
            lambda: held.append(
                len(
                    client.redis.xpending_range(keys.jobs, keys.group, min=f"({boundary}", max="+", count=100)
                )
            ),
            duration_s=2.0,
        )
        print(f"in flight after the restart (+{time.monotonic() - restarted_s:.1f} s): {held}")
        assert sorted(held)[len(held) // 2] >= 12, held  # the median sample
    finally:
        stop_all(workers, server)


def test_the_survey_counts_the_lag_redis_lost(tmp_path: Path) -> None:
    """The survey's queued count after an AOF restart equals the entries after the group's
    last-delivered id (counted here with XRANGE), on both of its counting paths: behind the
    last-delivered id (what is held and not yet trimmed), and forward when too much is kept
    behind it."""
    require_redis_server()
    with LocalRedis(use_server=True, data_dir=tmp_path, appendonly=True, fsync="always") as server:
        client = Client.from_url(server.url, partitions=0)  # one stream, read by hand below
        client.enqueue([Job(id=f"s{i:04d}", prompt="p") for i in range(3000)])
        keys = QueueKeys()
        read = client.redis.xreadgroup(keys.group, "w", {keys.jobs: ">"}, count=1200)
        client.redis.xack(keys.jobs, keys.group, *[entry for entry, _ in read[0][1][:1000]])
        server.kill()
        server.restart()
        admin = redis.Redis.from_url(server.url)
        assert admin.xinfo_groups(keys.jobs)[0]["lag"] is None
        last = admin.xinfo_groups(keys.jobs)[0]["last-delivered-id"].decode()
        truth = len(admin.xrange(keys.jobs, min=f"({last}", max="+"))
        assert truth == 1800
        queue = RedisJobQueue(admin, keys.queue, "w", 60_000, 10_000)
        queue.prepare()
        survey = queue.survey(max_age_s=60.0)
        assert survey is not None and survey.queued == truth
        counted = take(
            admin, keys, "w", 1, LagCount(max_counted=500)
        )  # 1,200 kept behind: counted forward, capped
        assert sum(counted.lag) == 500
        admin.close()


def held(admin: redis.Redis, name: str) -> int:
    """The jobs worker ``name`` held at its last heartbeat (-1 before its first)."""
    raw = admin.hget(QueueKeys().workers, name)
    beat = None if raw is None else decode_heartbeat(raw)
    return -1 if beat is None else beat.in_flight


def test_a_queue_lost_while_workers_held_jobs_gets_none_of_their_results(tmp_path: Path) -> None:
    """Redis restarted empty (no persistence) while 2 workers held 16 jobs: the workers drop
    those results (DATA LOSS in their logs) instead of writing them into the emptied Redis, so
    a `collect --no-wait` started afterwards writes nothing and exits 2 (unknown queue). The
    documented recovery, enqueue the same file again and collect into the same output, writes
    every id once, in order."""
    require_redis_server()
    server = LocalRedis(use_server=True, data_dir=tmp_path, appendonly=False).start()
    keys = QueueKeys()
    workers = []
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = [f"q{i:03d}" for i in range(40)]
    source.write_text("".join(json.dumps({"id": i, "prompt": "p"}) + "\n" for i in ids))
    try:
        assert radixq("enqueue", str(source), "--redis-url", server.url, "--no-routing").returncode == 0
        env = {"RADIXQ_FAKE_CAPACITY": "8", "RADIXQ_FAKE_LATENCY_S": "8", "RADIXQ_MAX_BACKOFF_S": "0.2"}
        workers = [start_worker(server.url, f"w{i}", tmp_path / f"w{i}.log", **env) for i in range(2)]
        admin = redis.Redis.from_url(server.url)
        wait_until(lambda: int(admin.xinfo_groups(keys.jobs)[0]["pending"]) == 16, "16 jobs read")
        # NOTE: a read is XREADGROUP then the epoch's HGET: killed between the two, a worker holds
        # nothing (the emptied Redis lost those entries anyway) and has nothing to drop; so kill
        # only once each worker's heartbeat counts its 8 (it beats every 2 s, the jobs take 8)
        wait_until(lambda: [held(admin, f"w{i}") for i in range(2)] == [8, 8], "both heartbeats holding 8")
        server.kill()
        server.restart()  # empty
        logs = [tmp_path / f"w{i}.log" for i in range(2)]

        def dropped() -> list[int]:
            """Results each worker logged as dropped (NOTE: one line a flush: jobs that finish in
            different steps on a loaded machine are logged apart)."""
            pattern = re.compile(r"DATA LOSS: dropped (\d+) results")
            return [sum(map(int, pattern.findall(log.read_text()))) for log in logs]

        wait_until(lambda: dropped() == [8, 8], lambda: f"both workers dropping their 8 (so far {dropped()})")
        assert admin.xlen(keys.results) == 0 and admin.hlen(keys.done) == 0
        collect = radixq("collect", "-o", str(out), "--no-wait", "--redis-url", server.url)
        assert collect.returncode == exits.USAGE, collect.stderr
        assert "unknown queue 'default'" in collect.stderr
        assert not out.exists() or out.read_text() == ""
        assert radixq("enqueue", str(source), "--redis-url", server.url, "--no-routing").returncode == 0
        collect = radixq("collect", "-o", str(out), "--redis-url", server.url, "--quiet", timeout_s=300)
        assert collect.returncode == exits.OK, collect.stderr
        assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ids
        admin.close()
    finally:
        stop_all(workers, server)


def stop_all(workers: list[subprocess.Popen[bytes]], server: LocalRedis) -> None:
    for proc in workers:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    server.stop()
