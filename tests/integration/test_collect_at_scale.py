"""collect beside a routed worker pool and running producers, at the scale where it matters:
a routed queue at maxmemory drains through collect (issue 30, item 1), and a collect started
before four producers waits for all of them (item 3). `radixq` subprocesses throughout, the
fake generator (tests/fake_generator.py) as the independent oracle of every row's text."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from producer.client import Client
from producer.local_redis import LocalRedis
from tests.conftest import require_redis_server
from tests.fake_generator import fake_text
from tests.integration.procs import radixq, start_radixq, start_worker
from tests.waiting import LIVENESS_S
from wire import exits
from wire.schema import Job, SamplingParams

pytestmark = pytest.mark.integration


def stop_all(procs: Sequence[subprocess.Popen[Any]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=LIVENESS_S)


def test_a_routed_queue_at_maxmemory_drains_through_collect(tmp_path: Path) -> None:
    """The issue's reproduction: 10,000 jobs (n=8) on a routed queue (16 partitions), Redis at
    maxmemory 4 MiB above what the queue holds, two workers that drain their partitions one at
    a time. collect spills each result as it comes and trims it, so the workers never stay
    stuck at maxmemory: every row is written, in input order, once."""
    require_redis_server()
    ids = [f"m{i:05d}" for i in range(10_000)]
    with LocalRedis(use_server=True, appendonly=False) as server:
        client = Client.from_url(server.url)
        client.enqueue(
            Job(id=job_id, prompt=f"question {job_id}", sampling=SamplingParams(n=8)) for job_id in ids
        )
        client.close()
        admin = redis.Redis(port=server.port)
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 4 * 1024 * 1024)
        env = {"RADIXQ_FAKE_LATENCY_S": "0.05"}
        workers = [start_worker(server.url, f"w{i}", tmp_path / f"w{i}.log", **env) for i in range(2)]
        try:
            done = radixq(
                "collect", "-o", str(tmp_path / "out.jsonl"), "--redis-url", server.url,
                "--retry-timeout-s", "600", "--quiet", timeout_s=LIVENESS_S,
            )  # fmt: skip
        finally:
            stop_all(workers)
        assert done.returncode == exits.OK, done.stderr
        assert admin.xlen("radixq:{default}:results") == 0
        admin.close()
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == ids
    assert all(
        [choice["text"] for choice in row["choices"]] == [fake_text(row["id"], i) for i in range(8)]
        for row in rows
    )


@pytest.mark.parametrize("expect", [["--expect", "2000"], ["--expect-enqueues", "4"]])
def test_a_collect_started_before_four_producers_waits_for_all_of_them(
    expect: list[str], redis_url: str, tmp_path: Path
) -> None:
    """collect --wait started before the queue exists, beside four producers of 500 jobs each
    and two workers: it waits for what is coming (2,000 jobs, or 4 finished enqueues) instead of
    stopping once it has what was enqueued so far. Every row once, each producer's in its order."""
    files = []
    for producer in range(4):
        source = tmp_path / f"in{producer}.jsonl"
        lines = [{"id": f"p{producer}-{i:03d}", "prompt": f"question {producer} {i}"} for i in range(500)]
        source.write_text("".join(json.dumps(line) + "\n" for line in lines))
        files.append((source, [line["id"] for line in lines]))
    out, log = tmp_path / "out.jsonl", tmp_path / "collect.log"
    collect = start_radixq("collect", "-o", str(out), "--redis-url", redis_url, "--quiet", *expect, log=log)
    producers = [
        start_radixq("enqueue", str(source), "--redis-url", redis_url, log=tmp_path / "enqueue.log")
        for source, _ in files
    ]
    workers = [start_worker(redis_url, f"w{i}", tmp_path / f"w{i}.log") for i in range(2)]
    try:
        assert [proc.wait(timeout=LIVENESS_S) for proc in producers] == [exits.OK] * 4
        assert collect.wait(timeout=LIVENESS_S) == exits.OK, log.read_text()
    finally:
        stop_all([proc for proc in [collect, *producers] if proc.poll() is None])
        stop_all(workers)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(row["id"] for row in rows) == sorted(i for _, ids in files for i in ids)
    assert all(row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)
    for _, ids in files:  # the queue's order interleaves the producers' batches, each in its order
        assert [row["id"] for row in rows if row["id"] in set(ids)] == ids
