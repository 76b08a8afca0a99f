"""A partitioned queue on the local 3-node Redis Cluster (tests/redis_cluster.py): every
command pointed at any node, the share of Redis commands each node serves, and a node killed
with SIGKILL and restarted (from its AOF and nodes.conf) while workers run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.fake_generator import fake_text
from tests.integration.procs import FAKE_GENERATOR, radixq, start_worker
from tests.redis_cluster import LocalCluster, cluster_client, running_cluster, wait_failed
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import QueueKeys

pytestmark = pytest.mark.integration

PARTITIONS = 16
FAST = {"RADIXQ_HEARTBEAT_S": "0.2", "RADIXQ_MIN_IDLE_S": "2.0", "RADIXQ_FAKE_CAPACITY": "8"}


def write_jobs(path: Path, prefix: str, count: int, groups: int = 8) -> list[str]:
    """``count`` jobs in ``groups`` prefix groups (so they spread over the partitions)."""
    ids = [f"{prefix}-{i}" for i in range(count)]
    with path.open("w") as out:
        for i, job_id in enumerate(ids):
            prompt = f"group {i % groups} shares this long opening line. " * 3 + f"then job {i}"
            out.write(json.dumps({"id": job_id, "prompt": prompt, "max_tokens": 4}) + "\n")
    return ids


def commands_per_node(ports: list[int]) -> dict[int, int]:
    """Calls served by each node so far (INFO commandstats), INFO and CLUSTER commands left out."""
    served = {}
    for port in ports:
        stats: Any = redis.Redis(port=port).info("commandstats")
        served[port] = sum(
            int(value["calls"])
            for name, value in stats.items()
            if not name.startswith(("cmdstat_info", "cmdstat_cluster", "cmdstat_command", "cmdstat_ping"))
        )
    return served


@pytest.fixture
def cluster():  # type: ignore[no-untyped-def]
    with running_cluster(3, aof=True) as nodes:
        yield nodes


def test_every_command_works_pointed_at_any_node(cluster: LocalCluster, tmp_path: Path) -> None:
    before = commands_per_node(cluster.ports)
    for n, port in enumerate(cluster.ports):
        scheme = "redis+cluster" if n == 2 else "redis"  # found by INFO cluster, or named
        url = f"{scheme}://127.0.0.1:{port}"
        queue = f"q{n}"
        source = tmp_path / f"{queue}.jsonl"
        ids = write_jobs(source, queue, 48)
        enqueued = radixq("enqueue", str(source), "-q", queue, "--redis-url", url, "--partitions", "16")
        assert enqueued.returncode == 0, enqueued.stderr
        status = radixq("status", "-q", queue, "--redis-url", url, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["partitions"] == PARTITIONS
        worker = start_worker(url, f"w{n}", tmp_path / f"w{n}.log", "--queue", queue, **FAST)
        out = tmp_path / f"{queue}.out.jsonl"
        try:
            collected = radixq(
                "collect", "-o", str(out), "-q", queue, "--redis-url", url, "--wait", "--quiet"
            )
            assert collected.returncode == 0, collected.stderr
        finally:
            worker.terminate()
            assert worker.wait(timeout=LIVENESS_S) == 0, (tmp_path / f"w{n}.log").read_text()
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [row["id"] for row in rows] == ids
        assert all(row["choices"][0]["text"] == fake_text(row["id"]) for row in rows)
        letters = radixq("dlq", "list", "-q", queue, "--redis-url", url)
        assert letters.returncode == 0, letters.stderr
        ran = tmp_path / f"{queue}.run.jsonl"
        run = radixq(
            "run", str(source), "-o", str(ran), "-q", f"{queue}-run", "--redis-url", url,
            "--generator", FAKE_GENERATOR, "--timeout", "90", "--quiet",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert [json.loads(line)["id"] for line in ran.read_text().splitlines()] == ids
    served = {port: calls - before[port] for port, calls in commands_per_node(cluster.ports).items()}
    total = sum(served.values())
    shares = {port: round(calls / total, 3) for port, calls in served.items()}
    print(f"commands per node: {served} shares: {shares}")
    assert min(shares.values()) >= 0.15  # six queues ({Q} slots) and their partitions: every node works


def test_a_node_killed_mid_run_loses_no_job_and_duplicates_no_id(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{cluster.ports[0]}"
    source = tmp_path / "jobs.jsonl"
    ids = write_jobs(source, "k", 400, groups=16)
    enqueued = radixq("enqueue", str(source), "--redis-url", url, "--partitions", "16")
    assert enqueued.returncode == 0, enqueued.stderr
    slow = {**FAST, "RADIXQ_FAKE_LATENCY_S": "0.05"}
    workers = [start_worker(url, f"w{i}", tmp_path / f"w{i}.log", **slow) for i in range(2)]
    client = cluster_client(cluster.ports)
    keys = QueueKeys()
    # NOTE: a node that holds partitions, neither the queue's slot nor the port the workers use
    meta_port = client.get_node_from_key(keys.meta).port
    victim = next(port for port in cluster.ports[1:] if port != meta_port)
    assert any(client.get_node_from_key(keys.partition(p)).port == victim for p in range(PARTITIONS))
    out = tmp_path / "out.jsonl"
    try:
        wait_until(lambda: 40 <= client.hlen(keys.done) <= 200, "the workers at work")
        killed_at_done = client.hlen(keys.done)
        cluster.kill(victim)
        wait_failed(meta_port)  # past the node timeout: the cluster marks the node failed and stops serving
        cluster.restart(victim)
        collected = radixq("collect", "-o", str(out), "--redis-url", url, "--wait", "--quiet", timeout_s=300)
        assert collected.returncode == 0, collected.stderr
    finally:
        for worker in workers:
            worker.terminate()
        for i, worker in enumerate(workers):
            assert worker.wait(timeout=LIVENESS_S) == 0, (tmp_path / f"w{i}.log").read_text()
        client.close()
    rows = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    back = [
        line.split("back after ")[1]
        for i in range(2)
        for line in (tmp_path / f"w{i}.log").read_text().splitlines()
        if "back after" in line
    ]
    print(
        f"killed node {victim} at {killed_at_done} done; queue back after {back}; rows {len(rows)}, unique {len(set(rows))}"
    )
    assert rows == ids  # 0 jobs lost, 0 duplicate ids, in enqueue order
