"""A long-lived queue does not grow: once a trimming collect has written its jobs' rows, Redis
holds no per-job record of them (real redis-server, `radixq collect` as a subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from producer.client import Client
from tests.integration.procs import radixq
from tests.integration.results import complete_all
from wire import exits
from wire.keys import QueueKeys
from wire.schema import Job

pytestmark = pytest.mark.integration
KEYS = QueueKeys()
JOBS = 20_000


def test_redis_memory_returns_to_the_empty_queue_after_a_trimming_collect(
    redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    producer = Client(client, partitions=0)  # one stream: trimmed by hand below
    out = tmp_path / "out.jsonl"
    producer.enqueue([Job(id="first", prompt="p")])
    complete_all(client, ["first"])
    assert radixq("collect", "-o", str(out), "--redis-url", redis_url, "--quiet").returncode == exits.OK
    client.xtrim(
        KEYS.jobs, maxlen=0, approximate=False
    )  # what the workers' housekeeping does with acknowledged entries
    empty = int(client.info("memory")["used_memory"])
    ids = [f"j{i:06d}" for i in range(JOBS)]
    producer.enqueue(Job(id=i, prompt=f"question {i}") for i in ids)
    complete_all(client, ids)
    grown = int(client.info("memory")["used_memory"])
    collect = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--quiet", timeout_s=300)
    assert collect.returncode == exits.OK, collect.stderr
    client.xtrim(KEYS.jobs, maxlen=0, approximate=False)
    after = int(client.info("memory")["used_memory"])
    print(
        f"used_memory: empty {empty >> 10} KiB, {JOBS} jobs done {grown >> 10} KiB, collected {after >> 10} KiB"
    )
    assert grown - empty > 4 << 20  # the records were there...
    assert after - empty < 1 << 20  # ...and are gone
    for record in (KEYS.enqueued, KEYS.done, KEYS.failed, KEYS.order):
        assert not client.exists(record), record
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["first", *ids]
    status = producer.status()
    assert (status.enqueued, status.done, status.failed) == (JOBS + 1, JOBS + 1, 0)
    again = radixq("status", "--redis-url", redis_url)
    assert f"{JOBS + 1} enqueued" in again.stdout
    client.close()
