"""Each node's share of Redis commands for one queue on the local 3-node Redis Cluster.

    python benchmarks/cluster_share.py --jobs 800 --partitions 1 16

For each partition count: a fresh 3-node cluster (tests/redis_cluster.py), the jobs enqueued
through one node, two `radixq worker` processes (the fake generator) and a collect, then
INFO commandstats of every node: the calls each served, its share, and its busiest commands.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.integration.procs import radixq, start_worker  # noqa: E402
from tests.redis_cluster import cluster_client, running_cluster  # noqa: E402
from wire.keys import QueueKeys  # noqa: E402

SKIPPED = ("cmdstat_info", "cmdstat_cluster", "cmdstat_command", "cmdstat_ping", "cmdstat_config")


def served(port: int) -> dict[str, int]:
    stats: Any = redis.Redis(port=port).info("commandstats")
    return {name[8:]: int(v["calls"]) for name, v in stats.items() if not name.startswith(SKIPPED)}


def one_run(jobs: int, partitions: int, workers: int, folder: Path) -> dict[str, Any]:
    source = folder / f"jobs-{partitions}.jsonl"
    with source.open("w") as out:
        for i in range(jobs):
            prompt = f"group {i % 32} opens with this shared line. " * 3 + f"then {i}"
            out.write(json.dumps({"id": f"j{i}", "prompt": prompt, "max_tokens": 4}) + "\n")
    with running_cluster(3) as cluster:
        url = f"redis://127.0.0.1:{cluster.ports[0]}"
        before = {port: served(port) for port in cluster.ports}
        started = time.monotonic()
        done = radixq("enqueue", str(source), "--redis-url", url, "--partitions", str(partitions))
        assert done.returncode == 0, done.stderr
        env = {"RADIXQ_FAKE_CAPACITY": "16", "RADIXQ_FAKE_LATENCY_S": "0.02"}
        procs = [start_worker(url, f"w{i}", folder / f"w{partitions}-{i}.log", **env) for i in range(workers)]
        try:
            out = folder / f"out-{partitions}.jsonl"
            got = radixq("collect", "-o", str(out), "--redis-url", url, "--wait", "--quiet", timeout_s=600)
            assert got.returncode == 0, got.stderr
            wall_s = time.monotonic() - started
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
        rows = out.read_text().splitlines()
        assert len(rows) == jobs and len({json.loads(r)["id"] for r in rows}) == jobs
        meta_port = cluster_client(cluster.ports).get_node_from_key(QueueKeys().meta).port
        nodes = {}
        for port in cluster.ports:
            after = served(port)
            delta = {name: after[name] - before[port].get(name, 0) for name in after}
            nodes[port] = {k: v for k, v in delta.items() if v}
        total = sum(sum(d.values()) for d in nodes.values())
        return {
            "partitions": partitions,
            "wall_s": wall_s,
            "total": total,
            "meta_port": meta_port,
            "nodes": nodes,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    print(f"commit {commit.stdout.strip()}, {args.jobs} jobs, {args.workers} workers")
    with tempfile.TemporaryDirectory() as folder:
        for partitions in args.partitions:
            run = one_run(args.jobs, partitions, args.workers, Path(folder))
            print(
                f"\npartitions {partitions}: {run['total']} commands, {run['total'] / args.jobs:.1f} per job, "
                f"{run['wall_s']:.1f} s"
            )
            for port, counts in run["nodes"].items():
                calls = sum(counts.values())
                top = ", ".join(f"{n} {c}" for n, c in sorted(counts.items(), key=lambda kv: -kv[1])[:5])
                mark = " (queue's slot)" if port == run["meta_port"] else ""
                print(f"  node {port}{mark}: {calls} ({calls / run['total']:.0%}): {top}")


if __name__ == "__main__":
    main()
