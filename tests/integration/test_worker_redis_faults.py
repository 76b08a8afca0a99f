"""Workers against a real redis-server that refuses them, fills up, or loses its data."""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.local_redis import LocalRedis
from tests.conftest import require_redis_server
from tests.integration.procs import start_worker
from tests.jobs_stream import pending_count, total_len
from tests.waiting import LIVENESS_S, observe, wait_until
from wire.epoch import create_epoch
from wire.keys import QueueKeys
from wire.redis_errors import classify, describe
from wire.schema import Job
from wire.status import decode_heartbeat, now_ms
from wire.streams import ensure_groups
from worker.queue.streams.retention import trim_acked_jobs

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


def one_line_error(log_path: Path) -> str:
    text = log_path.read_text()
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def test_wrong_password_is_one_line_and_exit_2(redis_url: str, tmp_path: Path) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser("app", enabled=True, passwords=["+right"], commands=["+@all"], keys=["*"])
    url = redis_url.replace("redis://", "redis://app:wrong@")
    worker = start_worker(url, "w", tmp_path / "w.log")
    assert worker.wait(timeout=LIVENESS_S) == 2
    line = one_line_error(tmp_path / "w.log")
    assert "invalid username-password pair" in line and "app:***@" in line and "wrong" not in line


def test_acl_denial_is_one_line_and_exit_2(redis_url: str, tmp_path: Path) -> None:
    admin = redis.Redis.from_url(redis_url)
    Client(admin).enqueue([Job(id="a", prompt="x")])
    # may read the queue but not write results
    admin.acl_setuser("reader", enabled=True, passwords=["+pw"], commands=["+@all", "-xadd"], keys=["*"])
    url = redis_url.replace("redis://", "redis://reader:pw@")
    worker = start_worker(url, "w", tmp_path / "w.log")
    assert worker.wait(timeout=LIVENESS_S) == 2
    assert "no permissions to run the 'xadd' command" in one_line_error(tmp_path / "w.log")


def test_full_redis_keeps_results_in_the_outbox_until_there_is_room(redis_url: str, tmp_path: Path) -> None:
    admin = redis.Redis.from_url(redis_url)
    client = Client(admin)
    client.enqueue([Job(id=f"m{i}", prompt="x" * 2000) for i in range(200)])
    admin.config_set("maxmemory", str(admin.info("memory")["used_memory"] + 64 * 1024))
    env = {"RADIXQ_FAKE_CAPACITY": "50"}
    worker = start_worker(redis_url, "w", tmp_path / "w.log", **env)
    try:
        wait_until(
            lambda: "Redis is at maxmemory" in (tmp_path / "w.log").read_text(),
            "the worker to hit maxmemory",
        )

        def alive() -> None:
            assert worker.poll() is None, (tmp_path / "w.log").read_text()[-3000:]

        observe(alive, duration_s=1.0)  # it waits while Redis is full: it does not exit
        partial = admin.hlen(KEYS.done)
        assert partial < 200
        admin.config_set("maxmemory", "0")
        wait_until(lambda: admin.hlen(KEYS.done) == 200, "every job done once Redis has room")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0, (tmp_path / "w.log").read_text()[-3000:]
    assert pending_count(admin, KEYS) == 0
    assert "queue is back" in (tmp_path / "w.log").read_text()


def test_redis_restarted_without_its_data_is_reported_by_the_worker(tmp_path: Path) -> None:
    require_redis_server()
    server = LocalRedis(use_server=True, data_dir=tmp_path, appendonly=False).start()
    worker = None
    try:
        client = Client.from_url(server.url)
        client.enqueue([Job(id=f"r{i}", prompt="x") for i in range(50)])
        create_epoch(client.redis, KEYS)
        worker = start_worker(server.url, "w", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.01")
        wait_until(lambda: client.redis.hlen(KEYS.done) == 50, "the first jobs")
        done_ms = now_ms()
        wait_until(  # a heartbeat after the jobs: the worker has seen the epoch
            lambda: (
                (beat := decode_heartbeat(client.redis.hget(KEYS.workers, "w") or b"")) is not None
                and beat.last_seen_ms > done_ms
            ),
            "a heartbeat after the first jobs",
            tmp_path / "w.log",
        )
        server.kill()
        server.restart()
        wait_until(lambda: "DATA LOSS" in (tmp_path / "w.log").read_text(), "the worker to report the loss")
        client = Client.from_url(server.url)
        client.enqueue([Job(id=f"s{i}", prompt="x") for i in range(10)])
        wait_until(lambda: client.redis.hlen(KEYS.done) == 10, "jobs enqueued after the loss")
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=LIVENESS_S) == 0, (tmp_path / "w.log").read_text()[-3000:]
        server.stop()


def test_trimming_never_drops_a_pending_or_undelivered_entry(redis_url: str) -> None:
    """Random reads, acks, releases and trims from several consumers against a real Redis:
    after every trim, every entry still pending or never delivered is in the stream."""
    admin = redis.Redis.from_url(redis_url)
    ensure_groups(admin, KEYS)
    rng = random.Random(7)
    added: list[str] = []
    for step in range(400):
        op = rng.random()
        if op < 0.3:
            for _ in range(rng.randint(1, 5)):
                added.append(admin.xadd(KEYS.jobs, {"id": f"x{len(added)}", "job": b"-"}).decode())
        elif op < 0.55:
            admin.xreadgroup(KEYS.group, f"c{rng.randint(0, 3)}", {KEYS.jobs: ">"}, count=rng.randint(1, 4))
        elif op < 0.8:
            pending = admin.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 100)
            if pending:
                chosen = rng.sample(pending, k=rng.randint(1, len(pending)))
                admin.xack(KEYS.jobs, KEYS.group, *[p["message_id"] for p in chosen])
        else:
            trim_acked_jobs(admin, KEYS)
            present = {entry_id.decode() for entry_id, _ in admin.xrange(KEYS.jobs)}
            pending_ids = {
                p["message_id"].decode()
                for p in admin.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 10_000)
            }
            last = admin.xinfo_groups(KEYS.jobs)[0]["last-delivered-id"].decode()
            undelivered = {
                e for e in added if tuple(map(int, e.split("-"))) > tuple(map(int, last.split("-")))
            }
            assert pending_ids <= present, f"step {step}: a pending entry was trimmed"
            assert undelivered <= present, f"step {step}: an undelivered entry was trimmed"
    admin.xack(
        KEYS.jobs,
        KEYS.group,
        *[p["message_id"] for p in admin.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 10_000)],
    )
    admin.xreadgroup(KEYS.group, "c0", {KEYS.jobs: ">"}, count=10_000)
    admin.xack(
        KEYS.jobs,
        KEYS.group,
        *[p["message_id"] for p in admin.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 10_000)] or ["0-1"],
    )
    trim_acked_jobs(admin, KEYS)
    assert total_len(admin, KEYS) == 0  # once all is acknowledged, nothing is kept


def test_an_acl_denial_inside_any_script_is_fatal_and_says_so(redis_url: str) -> None:
    """Redis 7.0 answers a script's denied command with a plain ERR (no NOPERM): it is still an
    ACL denial, which retrying cannot fix."""
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser("noclaim", enabled=True, passwords=["+pw"], commands=["+@all", "-xclaim"], keys=["*"])
    user = redis.Redis.from_url(redis_url.replace("redis://", "redis://noclaim:pw@"))
    with pytest.raises(redis.RedisError) as denied:
        user.eval("return redis.call('XCLAIM', KEYS[1], 'g', 'c', 0, '0-1')", 1, "s")
    assert classify(denied.value) == "fatal"
    assert "lacks a permission radixq needs" in describe(denied.value, redis_url)
    user.close()
    admin.close()
