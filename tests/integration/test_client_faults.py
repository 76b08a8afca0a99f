"""enqueue and collect under Redis pressure and loss, against private redis-servers:
maxmemory (noeviction), a restart with AOF, a restart without data, trimming under load,
status after an AOF restart."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from producer.client import Client, EnqueueStopped
from producer.collector import Collector, _next, _parse
from producer.local_redis import LocalRedis
from tests.conftest import require_redis_server
from tests.fake_generator import fake_text
from tests.integration.procs import radixq, start_radixq, start_worker
from tests.jobs_stream import total_len
from tests.waiting import LIVENESS_S, wait_until
from wire import exits
from wire.keys import META_RESULTS_TRIMMED, QueueKeys
from wire.redis_errors import classify
from wire.schema import Job

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


def write_input(path: Path, count: int, prompt_len: int = 10) -> list[str]:
    ids = [f"q{i:05d}" for i in range(count)]
    path.write_text("".join(json.dumps({"id": i, "prompt": "x" * prompt_len}) + "\n" for i in ids))
    return ids


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=LIVENESS_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    require_redis_server()
    (tmp_path / "redis-data").mkdir()
    with LocalRedis(use_server=True, data_dir=tmp_path / "redis-data", appendonly=False) as local:
        yield local


def test_enqueue_at_maxmemory_stops_with_a_count_and_resumes(server: LocalRedis, tmp_path: Path) -> None:
    admin = redis.Redis(port=server.port)
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 2_000_000)
    source = tmp_path / "in.jsonl"
    ids = write_input(source, 10_000, prompt_len=300)
    stopped = radixq("enqueue", str(source), "--redis-url", server.url, "--retry-timeout-s", "1")
    assert stopped.returncode == exits.USAGE, stopped.stderr
    assert "Traceback" not in stopped.stderr
    match = re.search(
        r"enqueued (\d+) \(0 already enqueued\) of (\d+) valid jobs read, then stopped: (.*)", stopped.stderr
    )
    assert match, stopped.stderr
    count = int(match.group(1))
    assert int(match.group(2)) == count + 1000  # it streams: the batch it could not write was read
    assert "Redis is at maxmemory" in match.group(3) and "run the same command again" in match.group(3)
    # Batches of 1000 are MULTI transactions: exactly the reported ids went in, all or nothing.
    assert 0 < count < 10_000 and count % 1000 == 0
    assert admin.hlen(KEYS.enqueued) == total_len(admin, KEYS) == count
    assert [i.decode() for i in admin.lrange(KEYS.order, 0, -1)] == ids[:count]

    admin.config_set("maxmemory", 0)
    resumed = radixq("enqueue", str(source), "--redis-url", server.url)
    assert resumed.returncode == exits.OK, resumed.stderr
    assert f"enqueued {10_000 - count}, skipped {count} (already enqueued)" in resumed.stdout
    assert total_len(admin, KEYS) == 10_000
    assert [i.decode() for i in admin.lrange(KEYS.order, 0, -1)] == ids
    admin.close()


def test_enqueue_waits_while_redis_is_full(server: LocalRedis, tmp_path: Path) -> None:
    admin = redis.Redis(port=server.port)
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 2_000_000)
    source = tmp_path / "in.jsonl"
    write_input(source, 10_000, prompt_len=300)
    log = tmp_path / "enqueue.log"
    proc = start_radixq("enqueue", str(source), "--redis-url", server.url, log=log)
    try:
        wait_until(lambda: "errorstat_OOM" in admin.info("errorstats"))
        wait_until(lambda: "waiting for Redis" in log.read_text(), "enqueue to wait for room", log)
        admin.config_set("maxmemory", 0)  # someone collected results or raised the limit
        assert proc.wait(timeout=LIVENESS_S) == exits.OK, log.read_text()
    finally:
        stop(proc)
    text = log.read_text()
    assert "enqueued 10000, skipped 0" in text
    assert text.count("waiting for Redis") == 1 and "Redis answers again" in text
    assert total_len(admin, KEYS) == 10_000
    admin.close()


def test_collect_waits_through_a_redis_restart(tmp_path: Path) -> None:
    require_redis_server()
    (tmp_path / "redis-data").mkdir()
    server = LocalRedis(use_server=True, data_dir=tmp_path / "redis-data", appendonly=True).start()
    out, log = tmp_path / "out.jsonl", tmp_path / "collect.log"
    ids = [f"r{i:03d}" for i in range(300)]
    Client.from_url(server.url).enqueue([Job(id=i, prompt="p") for i in ids])
    env = {"RADIXQ_FAKE_CAPACITY": "8", "RADIXQ_FAKE_LATENCY_S": "0.02"}
    worker = start_worker(server.url, "w", tmp_path / "w.log", **env)
    collect = start_radixq("collect", "-o", str(out), "--redis-url", server.url, "--timeout", "90", log=log)
    try:
        wait_until(lambda: line_count(out) >= 30)
        server.kill()
        wait_until(lambda: "waiting for Redis" in log.read_text(), "collect to wait out the outage", log)
        server.restart()
        assert collect.wait(timeout=LIVENESS_S) == exits.OK, log.read_text()
    finally:
        stop(collect)
        stop(worker)
        server.stop()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == ids
    assert all(row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)
    text = log.read_text()
    assert text.count("waiting for Redis") == 1 and "Redis answers again" in text, text


def test_lost_queue_is_said_loudly_and_recovered_by_enqueueing_again(
    server: LocalRedis, tmp_path: Path
) -> None:
    source, out, log = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "collect.log"
    ids = write_input(source, 2000)
    assert radixq("enqueue", str(source), "--redis-url", server.url).returncode == exits.OK
    env = {"RADIXQ_FAKE_CAPACITY": "16", "RADIXQ_FAKE_LATENCY_S": "0.05"}
    worker = start_worker(server.url, "w1", tmp_path / "w1.log", **env)
    collect = start_radixq("collect", "-o", str(out), "--redis-url", server.url, "--timeout", "120", log=log)
    try:
        wait_until(lambda: line_count(out) >= 300)
        stop(worker)
        server.kill()
        server.restart()  # without its data: no AOF
        assert collect.wait(timeout=LIVENESS_S) == exits.JOBS_FAILED, log.read_text()
    finally:
        stop(collect)
        stop(worker)
    text = log.read_text()
    assert "Traceback" not in text
    assert "Redis no longer knows this queue" in text and "enqueue the same input file again" in text
    first = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert 300 <= len(first) < 2000 and len(set(first)) == len(first)
    assert f"{2000 - len(first)} jobs of this queue have no result" in text

    again = radixq("enqueue", str(source), "--redis-url", server.url)
    assert again.returncode == exits.OK and "enqueued 2000, skipped 0" in again.stdout
    worker = start_worker(server.url, "w2", tmp_path / "w2.log", RADIXQ_FAKE_CAPACITY="64")
    try:
        resumed = radixq("collect", "-o", str(out), "--redis-url", server.url, "--timeout", "120")
        assert resumed.returncode == exits.OK, resumed.stderr
    finally:
        stop(worker)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == ids  # every id exactly once
    assert [row["id"] for row in rows[: len(first)]] == first  # rows already written stay
    assert all(row["error"] is None and row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)


def test_trim_under_load_keeps_what_is_unwritten(server: LocalRedis, tmp_path: Path) -> None:
    client = Client.from_url(server.url)
    ids = [f"t{i:04d}" for i in range(3000)]
    client.enqueue([Job(id=i, prompt="p") for i in ids])
    env = {"RADIXQ_FAKE_CAPACITY": "32", "RADIXQ_FAKE_LATENCY_S": "0.01"}
    workers = [start_worker(server.url, f"w{i}", tmp_path / f"w{i}.log", **env) for i in range(2)]
    collector = Collector(client.redis)
    lengths: list[int] = []

    def check_between_rounds() -> bool:
        # Everything read is gone from the stream (it is in the spill or the output): only
        # results not read yet are left.
        first = client.redis.xrange(KEYS.results, count=1)
        assert not first or _parse(first[0][0].decode()) >= _next(collector._last_entry)
        lengths.append(client.redis.xlen(KEYS.results))
        return False

    out = tmp_path / "out.jsonl"
    try:
        report = collector.collect(
            out, poll_s=0.05, timeout_s=120, should_stop=check_between_rounds, trim=True
        )
    finally:
        for worker in workers:
            stop(worker)
    assert report.missing == [] and len(lengths) > 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == ids
    assert all(row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)
    assert client.redis.xlen(KEYS.results) == 0 and client.redis.hget(KEYS.meta, META_RESULTS_TRIMMED)
    assert max(lengths) < 3000  # the stream never held everything
    # Their per-id records went with them (producer.forget); status still counts them.
    assert client.redis.hlen(KEYS.done) == 0 and client.redis.llen(KEYS.order) == 0
    assert client.status().done == 3000
    client.close()


def test_status_counts_queued_after_an_aof_restart(tmp_path: Path) -> None:
    require_redis_server()
    with LocalRedis(use_server=True, data_dir=tmp_path, appendonly=True) as server:
        client = Client.from_url(server.url, partitions=0)  # one stream, read by hand below
        client.enqueue([Job(id=f"s{i}", prompt="x") for i in range(5)])
        client.redis.xreadgroup(KEYS.group, "ghost", {KEYS.jobs: ">"}, count=2)
        client.close()
        server.kill()
        server.restart()
        admin = redis.Redis(port=server.port)
        assert admin.xinfo_groups(KEYS.jobs)[0]["lag"] is None  # what Redis gives after the replay
        admin.close()
        proc = radixq("status", "--json", "--redis-url", server.url)
        assert proc.returncode == exits.OK, proc.stderr
        snapshot = json.loads(proc.stdout)
        assert (snapshot["enqueued"], snapshot["queued"], snapshot["in_flight"]) == (5, 3, 2)


def test_client_enqueue_raises_with_the_partial_report(server: LocalRedis) -> None:
    admin = redis.Redis(port=server.port)
    admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 1_000_000)
    ids = [f"p{i:05d}" for i in range(5000)]
    client = Client.from_url(server.url, retry_timeout_s=0.5)
    with pytest.raises(EnqueueStopped) as stopped:
        client.enqueue([Job(id=i, prompt="x" * 300) for i in ids], batch_size=500)
    report = stopped.value.report
    assert classify(stopped.value.cause) == "transient" and stopped.value.waited_s >= 0.5
    assert report.enqueued == ids[: admin.hlen(KEYS.enqueued)] and report.skipped == []
    assert 0 < len(report.enqueued) < 5000 and len(report.enqueued) % 500 == 0
    client.close()
    admin.close()
