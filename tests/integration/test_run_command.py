"""`radixq run`: the all-in-one job, with a private Redis, workers as subprocesses."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import msgspec
import pytest

from producer.client import Client
from producer.collector import Collector
from producer.local_redis import LocalRedis, free_port
from tests.fake_generator import fake_text
from tests.integration.procs import FAKE_GENERATOR, REPO_ROOT, radixq, start_worker, subprocess_env
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import QueueKeys
from wire.schema import Job
from wire.status import Heartbeat, now_ms

pytestmark = pytest.mark.integration
# NOTE: a run's or collect's own budget: generous (a hang guard), under radixq()'s 120 s
RUN_TIMEOUT = "100"


def test_run_writes_every_job_in_input_order_and_resumes(tmp_path: Path) -> None:
    source = REPO_ROOT / "examples" / "prompts.jsonl"
    expected = [json.loads(line)["id"] for line in source.read_text().splitlines() if line.strip()]
    out = tmp_path / "out.jsonl"
    done = radixq(
        "run",
        str(source),
        "-o",
        str(out),
        "--workers",
        "2",
        "--generator",
        FAKE_GENERATOR,
        "--timeout",
        RUN_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr
    assert "started a private" in done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == expected
    assert all(row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)
    water = next(row for row in rows if row["id"] == "water")
    assert len(water["choices"]) == 2 and water["metadata"] == {"topic": "science"}

    # Resume: drop the last two lines; a second run writes exactly those again.
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-2]) + lines[-2][:10])  # and a torn line
    again = radixq(
        "run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", RUN_TIMEOUT
    )
    assert again.returncode == 0, again.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == expected


def test_run_against_given_redis_with_openai_batch_file(redis_url: str, tmp_path: Path) -> None:
    source = tmp_path / "batch.jsonl"
    requests = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
        }
        for i in range(5)
    ]
    source.write_text("\n".join(json.dumps(r) for r in requests) + "\n")
    out = tmp_path / "out.jsonl"
    done = radixq(
        "run",
        str(source),
        "-o",
        str(out),
        "--redis-url",
        redis_url,
        "--generator",
        FAKE_GENERATOR,
        "--timeout",
        "60",
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["custom_id"] for row in rows] == [f"r{i}" for i in range(5)]
    for row in rows:
        assert row["response"]["body"]["choices"][0]["message"]["content"] == fake_text(row["custom_id"])
        assert "metadata" not in row["response"]["body"]


def test_rejected_lines_exit_1_and_the_valid_jobs_still_run(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    lines = [
        {"id": "a", "prompt": "x"},
        {"id": "bad", "prompt": "x", "max_tokens": "many"},
        {"id": "b", "prompt": "x"},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out.jsonl"
    done = radixq("run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", RUN_TIMEOUT)
    assert done.returncode == 1, done.stderr
    assert f"rejected {source}:line 2: " in done.stderr and "Traceback" not in done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # One row per input line, in input order: the rejected line is its invalid_job error row.
    assert [row["id"] for row in rows] == ["a", "bad", "b"]
    assert rows[0]["error"] is None and rows[2]["error"] is None
    assert rows[1]["error"]["code"] == "invalid_job" and "max_tokens" in rows[1]["error"]["message"]


def test_a_failed_job_exits_1_in_both_output_formats(redis_url: str, tmp_path: Path) -> None:
    native = tmp_path / "native.jsonl"
    native.write_text(
        json.dumps({"id": "ok", "prompt": "x"})
        + "\n"
        + json.dumps({"id": "boom", "prompt": "x", "metadata": {"fake_error": "internal"}})
        + "\n"
    )
    out = tmp_path / "native.out.jsonl"
    done = radixq("run", str(native), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", RUN_TIMEOUT)
    assert done.returncode == 1, done.stderr
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["ok"]["error"] is None and rows["boom"]["error"]["code"] == "internal"
    assert "1 job failed" in done.stderr

    batch = tmp_path / "batch.jsonl"
    requests = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "m",
                "messages": [{"role": "user", "content": "q"}],
                "metadata": {"fake_error": "internal"} if i == 1 else {},
            },
        }
        for i in range(3)
    ]
    batch.write_text("".join(json.dumps(r) + "\n" for r in requests))
    out = tmp_path / "batch.out.jsonl"
    args = ["run", str(batch), "-o", str(out), "--redis-url", redis_url, "--generator", FAKE_GENERATOR]
    done = radixq(*args, "--timeout", RUN_TIMEOUT)
    assert done.returncode == 1, done.stderr
    rows = {row["custom_id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert [rows[f"r{i}"]["error"] is not None for i in range(3)] == [False, True, False]
    again = radixq(*args, "--timeout", RUN_TIMEOUT)  # nothing left to run; the failure still counts
    assert again.returncode == 1 and "resuming: 3 jobs already" in again.stderr


def test_unreachable_or_refusing_redis_exits_2_with_one_line(tmp_path: Path) -> None:
    source = REPO_ROOT / "examples" / "prompts.jsonl"
    out = tmp_path / "out.jsonl"
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    done = radixq("run", str(source), "-o", str(out), "--redis-url", nobody, "--generator", FAKE_GENERATOR)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: redis at {nobody}: ")
    assert "Traceback" not in done.stderr
    with LocalRedis(use_server=True, appendonly=False, with_password=True) as server:
        wrong = server.url.replace(f":{server.password}@", ":wrong@")
        done = radixq("run", str(source), "-o", str(out), "--redis-url", wrong, "--generator", FAKE_GENERATOR)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "redis://:***@127.0.0.1" in line and "check the password" in line and "wrong" not in line
    assert "Traceback" not in done.stderr


def test_run_falls_back_to_fakeredis_without_a_redis_server_binary(tmp_path: Path) -> None:
    source = REPO_ROOT / "examples" / "prompts.jsonl"
    expected = [json.loads(line)["id"] for line in source.read_text().splitlines() if line.strip()]
    out = tmp_path / "out.jsonl"
    env = subprocess_env(PATH=str(tmp_path))  # no redis-server on PATH
    done = radixq(
        "run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", RUN_TIMEOUT, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "started a private fakeredis at redis://127.0.0.1:" in done.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == expected


def test_embedded_fakeredis_server_serves_a_worker(tmp_path: Path) -> None:
    """The fallback when no redis-server binary exists: fakeredis over TCP, real worker process."""
    with LocalRedis(use_server=False) as server:
        assert server.kind == "fakeredis"
        client = Client.from_url(server.url)
        client.enqueue([Job(id=f"f{i}", prompt="x") for i in range(20)])
        worker = start_worker(server.url, "fw", tmp_path / "fw.log", "--min-idle-s", "0.5")
        try:
            report = Collector(client.redis).collect(tmp_path / "o.jsonl", wait=True, timeout_s=60)
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=LIVENESS_S) == 0, (tmp_path / "fw.log").read_text()[-2000:]
        assert report.missing == [] and report.written == 20
        client.close()


def test_status_and_dlq_commands(redis_url: str, tmp_path: Path) -> None:
    client = Client.from_url(redis_url, partitions=0)  # one stream: a ghost reads it below
    keys = QueueKeys()
    client.enqueue([Job(id=f"s{i}", prompt="x") for i in range(3)])
    client.redis.xreadgroup(keys.group, "ghost", {keys.jobs: ">"}, count=2)
    # The ghost beat once, 10 s ago, every 0.1 s: dead once it has also been idle 0.5 s.
    last_seen_ms = now_ms() - 10_000
    beat = Heartbeat(name="ghost", pid=1, last_seen_ms=last_seen_ms, interval_s=0.1)
    client.redis.hset(keys.workers, "ghost", msgspec.msgpack.encode(beat))
    wait_until(  # the ghost's entries idle past 0.5 s
        lambda: all(
            e["time_since_delivered"] >= 600
            for e in client.redis.xpending_range(keys.jobs, keys.group, "-", "+", 10, consumername="ghost")
        ),
        "the ghost to idle 0.6 s",
    )
    status = radixq("status", "--redis-url", redis_url, "--json")
    asked_within_s = (now_ms() - last_seen_ms) / 1000  # the age can be no more than this
    assert status.returncode == 0, status.stderr
    snapshot = json.loads(status.stdout)
    assert (snapshot["queued"], snapshot["in_flight"], snapshot["done"]) == (1, 2, 0)
    (ghost,) = snapshot["consumers"]
    assert (ghost["name"], ghost["in_flight"], ghost["alive"]) == ("ghost", 2, False)
    assert 10 <= ghost["heartbeat_age_s"] <= asked_within_s + 1  # + 1: it is shown rounded
    text = radixq("status", "--redis-url", redis_url).stdout
    assert re.search(r"consumer ghost: dead: last heartbeat \d+ s ago, idle \d+ s, holds 2 jobs", text), text
    worker = start_worker(redis_url, "w", tmp_path / "w.log", "--min-idle-s", "0.2", "--max-attempts", "1")
    try:
        wait_until(
            lambda: client.redis.hlen(keys.done) >= 3, "the 3 jobs done", tmp_path / "w.log", poll_s=0.05
        )
        running = r"consumer w: running, 0 in flight, idle \d+ ms, heartbeat [\d.]+ s ago"
        wait_until(  # polled: a heartbeat late on a loaded box may show it dead in one listing
            lambda: re.search(running, radixq("status", "--redis-url", redis_url).stdout) is not None,
            "status to show w running",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    listed = radixq("dlq", "list", "--redis-url", redis_url)
    assert listed.returncode == 0
    assert listed.stdout.count("attempts=2") == 2 and "s0" in listed.stdout and "s1" in listed.stdout
    text = radixq("status", "--redis-url", redis_url).stdout
    assert "dead-lettered 2" in text and "failed        2" in text
    out = tmp_path / "out.jsonl"
    first = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--no-wait")
    assert first.returncode == 1 and "2 jobs failed" in first.stderr  # the dead-letter rows

    requeued = radixq("dlq", "requeue", "s0", "nosuch", "--redis-url", redis_url)
    assert requeued.returncode == 1 and "requeued 1 job" in requeued.stdout
    assert "error: no dead letter for 1 id: nosuch" in requeued.stderr
    assert client.redis.xlen(keys.dead) == 1 and client.redis.hget(keys.done, "s0") is None
    assert client.redis.hget(keys.requeued, "s0") == b"1"
    worker = start_worker(redis_url, "w2", tmp_path / "w2.log")
    try:
        resumed = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--timeout", RUN_TIMEOUT)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    # s0's dead-letter row was replaced in place by its new result; s1 is still dead-lettered.
    assert resumed.returncode == 1 and "replaced 1 row with new results" in resumed.stdout, resumed.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == ["s0", "s1", "s2"]
    assert rows[0]["error"] is None and rows[0]["choices"][0]["text"] == fake_text("s0")
    assert rows[1]["error"]["code"] == "dead_letter"
    everything = radixq("dlq", "requeue", "--redis-url", redis_url)
    assert everything.returncode == 0 and "requeued 1 job" in everything.stdout
    client.close()
