"""A pool of N queue consumers on one Redis: what the queue costs per job, and how it behaves.

N consumers (worker.queue.consumer.Consumer on worker.queue.streams.RedisJobQueue, each with
its own Redis connection, as N worker hosts have) are driven by the fake generator
(tests/fake_generator.py: each job takes ``--latency-s`` in one of ``--capacity`` slots), as
threads shared by ``--processes`` processes, so a 1,000-consumer pool runs on 2 cores. The
queue is a default one (as `radixq enqueue` makes it), its jobs in prefix groups. One
private redis-server (producer.local_redis) serves each pool size, or with ``--cluster`` a
fresh 3-node Redis Cluster (tests/redis_cluster.py; each consumer a cluster client, as
`radixq worker` is when its URL names a cluster node), its statistics reset after the
enqueue. Reported per N:

- jobs/s end to end: from starting the consumers to the last job done;
- Redis commands per job: ``INFO commandstats`` over the run (the simulator's own polling and
  ``status`` calls counted and taken out), divided by the jobs; with the commands by name (on
  a cluster: summed over the nodes, and each node's share of them);
- Redis CPU share: ``used_cpu_sys + used_cpu_user`` over the run / its wall time (on a
  cluster: summed over the nodes, and each node's);
- ``status`` latency: ``Client.status()`` (what `radixq status` reads) once a second;
- reclaim: halfway through, 10% of the consumers die (their loops stop, no drain, no leave);
  the time from then until every job they held has a result (``--min-idle-s`` is most of it);
- fairness: the fewest jobs a surviving consumer ran, against the survivors' mean.

    python benchmarks/pool_sim.py --consumers 10,100,1000 --out pool_sim.json
    python benchmarks/pool_sim.py --consumers 100 --cluster
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import redis  # noqa: E402

from producer.client import Client  # noqa: E402
from producer.local_redis import LocalRedis  # noqa: E402
from tests.fake_generator import FakeGenerator  # noqa: E402
from tests.redis_cluster import running_cluster  # noqa: E402
from wire.cluster import connect  # noqa: E402
from wire.keys import QueueKeys  # noqa: E402
from wire.schema import Job, SamplingParams  # noqa: E402
from worker.queue.config import ConsumerConfig  # noqa: E402
from worker.queue.consumer import Consumer  # noqa: E402
from worker.queue.streams import RedisJobQueue  # noqa: E402


def make_jobs(count: int, groups: int, seed: int) -> list[Job]:
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=8)
    prefixes = [f"group {g} shares this system prompt " + "x" * 300 for g in range(groups)]
    jobs = [
        Job(id=f"j{i}", prompt=f"{prefixes[i % groups]} question {i}", sampling=sampling)
        for i in range(count)
    ]
    rng.shuffle(jobs)
    return jobs


@dataclass(frozen=True)
class Target:
    """Where the pool runs: one server, or the nodes of a cluster (``url`` names the first)."""

    url: str
    ports: list[int]
    cluster: bool

    def consumer_client(self) -> redis.Redis:
        if self.cluster:
            return connect(self.url)
        return redis.Redis(port=self.ports[0], socket_timeout=30)

    def nodes(self) -> list[redis.Redis]:
        return [redis.Redis(port=port) for port in self.ports]


@contextmanager
def target(cluster: bool) -> Iterator[Target]:
    """A fresh private redis-server, or a fresh 3-node cluster."""
    if cluster:
        with running_cluster(3) as nodes:
            yield Target(f"redis://127.0.0.1:{nodes.ports[0]}", list(nodes.ports), True)
    else:
        with LocalRedis(use_server=True) as server:
            yield Target(server.url, [server.port], False)


def consumer_process(
    where: Target, queue: str, names: list[str], args: dict[str, Any], control: Any, report: Any
) -> None:
    """Run ``names`` as consumer threads; ``control`` says "kill K" (K die at once) or "stop"."""
    config_of = {
        name: ConsumerConfig(
            queue=queue,
            name=name,
            min_idle_s=args["min_idle_s"],
            drain_timeout_s=5.0,
            **args["consumer"],
        )
        for name in names
    }
    consumers: list[Consumer] = []
    for name in names:
        config = config_of[name]
        client = where.consumer_client()
        jq = RedisJobQueue(
            client, queue, name, config.min_idle_ms, config.dead_after_ms, config.steal_after_s
        )
        generator = FakeGenerator(capacity=args["capacity"], latency_s=args["latency_s"])
        consumers.append(Consumer(jq, generator, config))
    killed: set[int] = set()
    stopping = threading.Event()

    def loop(index: int) -> None:
        consumer = consumers[index]
        while not stopping.is_set() and index not in killed:
            consumer.guarded(consumer.step)
        if index in killed:
            return
        consumer.drain()

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(consumers))]
    for thread in threads:
        thread.start()
    while True:
        command = control.get()
        if command[0] == "kill":
            victims = list(range(command[1]))
            killed.update(victims)
            time.sleep(0.5)  # their loops stop within a step
            held = [job_id for i in victims for job_id in consumers[i].jobs.job_ids()]
            report.put(("killed", held))
        elif command[0] == "stop":
            break
    stopping.set()
    for thread in threads:
        thread.join(timeout=30)
    counts = {c.name: c.completed for i, c in enumerate(consumers) if i not in killed}
    report.put(("counts", counts))


def command_counts(node: redis.Redis) -> dict[str, int]:
    stats: Any = node.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def all_counts(nodes: list[redis.Redis]) -> dict[str, int]:
    total: dict[str, int] = {}
    for node in nodes:
        for name, calls in command_counts(node).items():
            total[name] = total.get(name, 0) + calls
    return total


def cpu_s(node: redis.Redis) -> float:
    info: Any = node.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def run_pool(where: Target, consumers: int, args: argparse.Namespace) -> dict[str, Any]:
    queue = f"sim{consumers}"
    keys = QueueKeys(queue)
    jobs_count = consumers * args.jobs_per_consumer
    client = Client.from_url(where.url, queue)
    client.enqueue(make_jobs(jobs_count, args.groups, args.seed), keep_ids=False)
    admin = client.redis
    nodes = where.nodes()
    processes = min(args.processes, consumers)
    names = [f"c{i:04d}" for i in range(consumers)]
    shares = [names[p::processes] for p in range(processes)]
    settings = {
        "min_idle_s": args.min_idle_s,
        "capacity": args.capacity,
        "latency_s": args.latency_s,
        "consumer": json.loads(args.consumer_settings),
    }
    ctx = mp.get_context("fork")
    controls = [ctx.Queue() for _ in range(processes)]
    report = ctx.Queue()
    for node in nodes:
        node.config_resetstat()
    before_cpu, start = [cpu_s(node) for node in nodes], time.perf_counter()
    procs = [
        ctx.Process(target=consumer_process, args=(where, queue, share, settings, control, report))
        for share, control in zip(shares, controls, strict=True)
    ]
    for proc in procs:
        proc.start()
    polls, orphan_polls, killed_at, reclaimed_s = 0, 0, None, None
    status_s: list[float] = []
    orphans: set[str] = set()
    next_status = start + 1.0
    kill = max(1, round(consumers * args.kill_fraction)) if args.kill_fraction > 0 else 0
    while True:
        done = admin.hlen(keys.done)
        polls += 1
        now = time.perf_counter()
        if killed_at is None and kill and done >= jobs_count // 2:
            killed_at = now
            for p, control in enumerate(controls):
                control.put(("kill", kill // processes + (1 if p < kill % processes else 0)))
            for _ in controls:
                orphans.update(report.get()[1])
        if orphans and reclaimed_s is None:
            marks = admin.hmget(keys.done, sorted(orphans))
            orphan_polls += 1
            if all(mark is not None for mark in marks):
                reclaimed_s = time.perf_counter() - killed_at
        if now >= next_status:
            t0 = time.perf_counter()
            client.status()
            status_s.append(time.perf_counter() - t0)
            next_status = now + 1.0
        if done >= jobs_count and (reclaimed_s is not None or not orphans):
            break
        if now - start > args.timeout_s:
            raise RuntimeError(f"{done} of {jobs_count} done after {args.timeout_s} s")
        time.sleep(0.2)
    wall_s = time.perf_counter() - start
    used_cpu = [cpu_s(node) - before for node, before in zip(nodes, before_cpu, strict=True)]
    calls = all_counts(nodes)
    per_node = [
        sum(c for n, c in command_counts(node).items() if not n.startswith(("info", "config")))
        for node in nodes
    ]
    for control in controls:
        control.put(("stop",))
    counts: dict[str, int] = {}
    for _ in controls:
        kind, value = report.get()
        counts.update(value)
    for proc in procs:
        proc.join(timeout=60)
    # NOTE: what the simulator itself sent: HLEN/HMGET polls, and each status call's commands
    own = dict.fromkeys(["info", "config|resetstat", "config"], 0)
    probe_before = all_counts(nodes)
    client.status()
    probe_after = all_counts(nodes)
    per_status = {n: probe_after[n] - probe_before.get(n, 0) for n in probe_after if n != "info"}
    ours = {"hlen": polls, "hmget": orphan_polls}
    for name, count in per_status.items():
        ours[name] = ours.get(name, 0) + count * len(status_s)
    worker_calls = {
        n: c - ours.get(n, 0) for n, c in calls.items() if n not in own and c - ours.get(n, 0) > 0
    }
    total = sum(worker_calls.values())
    survivors = list(counts.values())
    mean = statistics.mean(survivors) if survivors else 0.0
    client.close()
    for node in nodes:
        node.close()
    return {
        "cluster_nodes": len(nodes) if where.cluster else 0,
        "consumers": consumers,
        "processes": processes,
        "jobs": jobs_count,
        "wall_s": round(wall_s, 2),
        "jobs_per_s": round(jobs_count / wall_s, 1),
        "commands": total,
        "commands_per_job": round(total / jobs_count, 2),
        "redis_cpu_share": round(sum(used_cpu) / wall_s, 3),
        "node_cpu_shares": [round(cpu / wall_s, 3) for cpu in used_cpu],
        # NOTE: of the calls each node served, the simulator's HLEN/HMGET polls and status calls
        # included (those on the {Q} node)
        "node_call_shares": [round(n / max(1, sum(per_node)), 3) for n in per_node],
        "status_ms_median": round(1000 * statistics.median(status_s), 1) if status_s else None,
        "status_ms_max": round(1000 * max(status_s), 1) if status_s else None,
        "killed": kill,
        "orphaned_jobs": len(orphans),
        "reclaim_s": round(reclaimed_s, 2) if reclaimed_s is not None else None,
        "fewest_jobs": min(survivors) if survivors else 0,
        "mean_jobs": round(mean, 1),
        "fewest_of_mean": round(min(survivors) / mean, 3) if mean else None,
        "by_command": dict(sorted(worker_calls.items(), key=lambda kv: -kv[1])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--consumers", default="10,100,1000", help="comma-separated pool sizes")
    parser.add_argument("--processes", type=int, default=4, help="processes sharing the consumer threads")
    parser.add_argument("--jobs-per-consumer", type=int, default=40)
    parser.add_argument("--groups", type=int, default=64, help="prefix groups among the jobs")
    parser.add_argument("--capacity", type=int, default=8, help="slots per fake generator")
    parser.add_argument("--latency-s", type=float, default=1.0, help="time a fake job takes")
    parser.add_argument(
        "--min-idle-s", type=float, default=3.0, help="lease: a dead consumer's jobs come back after this"
    )
    parser.add_argument("--kill-fraction", type=float, default=0.1)
    parser.add_argument("--consumer-settings", default="{}", help="JSON: more ConsumerConfig fields")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cluster", action="store_true", help="on a fresh local 3-node Redis Cluster")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    results = []
    for consumers in [int(n) for n in args.consumers.split(",")]:
        with target(args.cluster) as where:
            result = run_pool(where, consumers, args)
        print(json.dumps(result), flush=True)
        results.append(result)
    for r in results:
        print(
            f"N={r['consumers']:>5}{' (cluster)' if r['cluster_nodes'] else ''}: {r['jobs_per_s']:>8.1f} jobs/s, {r['commands_per_job']:.2f} commands/job, "
            f"Redis CPU {100 * r['redis_cpu_share']:.0f}%, status {r['status_ms_median']} ms (max {r['status_ms_max']}), "
            f"reclaim {r['reclaim_s']} s, fewest/mean {r['fewest_of_mean']}"
        )
    if args.out:
        settings = {k: v for k, v in vars(args).items() if k not in ("out", "consumers")}
        Path(args.out).write_text(json.dumps({"settings": settings, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
