"""Queue scenarios: `radixq worker` processes with the fake backend (tests/fake_backend.py,
slowed by RADIXQ_FAKE_LATENCY_S) against a private redis-server, and faults of the workers or
of Redis itself. Each returns what it observed (tests.chaos.lab.Observed).

Every scenario enqueues a file with `radixq enqueue`, collects with `radixq collect` running in
the background from the start (as a user would), and, where Redis lost writes, recovers the
documented way: enqueue the same file again, collect again into the same output.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import redis

from tests.chaos.lab import KEYS, Lab, Observed, line_count

COLLECT_TIMEOUT_S = 150
# What collect says when Redis lost the queue's data (producer.epoch, producer.collector).
LOSS_PHRASES = (
    "Redis no longer knows this queue",
    "Redis lost this queue's data",
    "Redis lost part of this queue",
    "Redis has no epoch and no order list",
)


def write_input(path: Path, count: int, prompt_len: int = 8) -> list[str]:
    ids = [f"q{i:05d}" for i in range(count)]
    path.write_text(
        "".join(json.dumps({"id": i, "prompt": "x" * prompt_len, "max_tokens": 4}) + "\n" for i in ids)
    )
    return ids


def fake_env(capacity: int, latency_s: float, min_idle_s: float) -> dict[str, str]:
    return {
        "RADIXQ_FAKE_CAPACITY": str(capacity),
        "RADIXQ_FAKE_LATENCY_S": str(latency_s),
        "RADIXQ_MIN_IDLE_S": str(min_idle_s),
    }


def enqueue(lab: Lab, label: str, source: Path, url: str) -> None:
    code = lab.radixq(label, "enqueue", source, "--redis-url", url)
    lab.expect(code == 0, f"{label} exited {code}: {lab.log(label)[-300:]}")


def collect_in_background(lab: Lab, label: str, out: Path, url: str) -> Any:
    return lab.start(label, "collect", "-o", out, "--redis-url", url, "--timeout", str(COLLECT_TIMEOUT_S))


def held_by(client: redis.Redis, name: str) -> int:
    consumers: Any = client.xinfo_consumers(KEYS.jobs, KEYS.group)
    return next((c["pending"] for c in consumers if c["name"].decode() == name), 0)


def data_loss_reports(lab: Lab, labels: list[str]) -> list[str]:
    return [f"worker {label} logged DATA LOSS" for label in labels if "DATA LOSS" in lab.log(label)]


def finish_collect(
    lab: Lab, collect: Any, label: str, source: Path, out: Path, url: str, ids: list[str]
) -> tuple[int, list[str]]:
    """Wait for the background collect; after a loss it reported, recover as documented.
    Returns (ids with no row before the recovery, how the loss was reported)."""
    lab.wait_for(lambda: collect.poll() is not None, COLLECT_TIMEOUT_S + 30, f"{label} to exit")
    text = lab.log(label)
    if collect.returncode == 0:
        return 0, []
    written = {json.loads(line)["id"] for line in out.read_text().splitlines()} if out.exists() else set()
    missing = sum(i not in written for i in ids)
    said = [phrase for phrase in LOSS_PHRASES if phrase in text]
    detected = []
    if collect.returncode == 1 and said and "enqueue the same input file again" in text:
        detected.append(f"collect exit 1: '{said[0]}'")
    else:
        lab.problems.append(f"{label} exited {collect.returncode}: {text[-400:]}")
    enqueue(lab, "enqueue-again", source, url)
    again = lab.radixq(
        "collect-again", "collect", "-o", out, "--redis-url", url, "--timeout", str(COLLECT_TIMEOUT_S)
    )
    lab.expect(again == 0, f"collect after the recovery exited {again}: {lab.log('collect-again')[-300:]}")
    return missing, detected


def kill9_chaos(
    lab: Lab,
    jobs: int = 3000,
    workers: int = 3,
    period_s: tuple[float, float] = (1.0, 2.0),
    latency_s: float = 0.05,
    capacity: int = 8,
    min_idle_s: float = 2.0,
    seed: int = 8,
) -> Observed:
    """Several workers; every one to two seconds a random one of those holding jobs is
    kill -9'd and a new one started, until collect has every result."""
    server = lab.redis()
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_input(source, jobs)
    enqueue(lab, "enqueue", source, server.url)
    env = fake_env(capacity, latency_s, min_idle_s)
    pool = {f"w{i}": lab.fake_worker(server.url, f"w{i}", **env) for i in range(workers)}
    collect = collect_in_background(lab, "collect", out, server.url)
    admin = redis.Redis.from_url(server.url)
    rng = random.Random(seed)
    kills = held = 0
    while True:
        lab.sleep(rng.uniform(*period_s))
        if collect.poll() is not None:
            break
        holding = {name: held_by(admin, name) for name in sorted(pool)}
        if not any(holding.values()):
            continue  # the others are still starting (a worker takes 1-3 s to start here)
        victim = rng.choice([name for name, count in holding.items() if count])
        held += holding[victim]
        pool.pop(victim).kill()
        kills += 1
        name = f"w{workers + kills - 1}"
        pool[name] = lab.fake_worker(server.url, name, **env)
    admin.close()
    lab.expect(collect.returncode == 0, f"collect exited {collect.returncode}: {lab.log('collect')[-300:]}")
    lab.notes.append(f"{kills} workers killed holding {held} jobs in all")
    for name in pool:
        lab.wait_for(lambda: "consuming" in lab.log(name), 30, f"worker {name} to start")  # noqa: B023
        lab.expect(lab.stop(name) == 0, f"worker {name} did not drain and exit 0")
    return Observed(out, ids)


def redis_crash(
    lab: Lab,
    appendonly: bool = True,
    fsync: str = "always",
    jobs: int = 2000,
    down_s: float = 1.5,
    latency_s: float = 0.03,
) -> Observed:
    """Redis kill -9'd a quarter of the way through and started again on the same port and
    folder: from its AOF (``appendonly``, fsync ``always`` or ``everysec``) or empty (no
    persistence). Workers and collect keep running through it."""
    server = lab.redis(appendonly=appendonly, fsync=fsync)
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_input(source, jobs)
    enqueue(lab, "enqueue", source, server.url)
    labels = ["w0", "w1"]
    for label in labels:
        lab.fake_worker(server.url, label, **fake_env(8, latency_s, 5.0))
    collect = collect_in_background(lab, "collect", out, server.url)
    lab.wait_for(lambda: line_count(out) >= jobs // 4, 60, "a quarter of the results")
    admin = redis.Redis.from_url(server.url)
    before = admin.hlen(KEYS.done)
    server.kill()
    lab.sleep(down_s)
    lab.restart(server)
    after = admin.hlen(KEYS.done)  # the workers wait out their backoff: nothing new yet
    admin.close()
    lab.notes.append(f"{before} jobs marked done just before the kill, {after} just after the restart")
    missing, detected = finish_collect(lab, collect, "collect", source, out, server.url, ids)
    detected += data_loss_reports(lab, labels)
    if appendonly and fsync == "always":
        lab.expect(not detected, f"an AOF with fsync always lost writes: {detected}")
        return Observed(out, ids)
    return Observed(out, ids, missing_before=missing, detected=detected)


def zombie_worker(
    lab: Lab, jobs: int = 1500, workers: int = 3, min_idle_s: float = 2.0, stopped_s: float = 6.0
) -> Observed:
    """One worker holding jobs is SIGSTOPped for longer than min_idle, then SIGCONTed: the others
    take its jobs over; it wakes up, finishes them too; each id is still written once."""
    server = lab.redis()
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_input(source, jobs)
    enqueue(lab, "enqueue", source, server.url)
    env = fake_env(8, 0.05, min_idle_s)
    for i in range(workers):
        lab.fake_worker(server.url, f"w{i}", **env)
    collect = collect_in_background(lab, "collect", out, server.url)
    admin = redis.Redis.from_url(server.url)
    lab.wait_for(lambda: line_count(out) >= jobs // 5 and held_by(admin, "w0") > 0, 60, "w0 to hold jobs")
    zombie = lab.procs["w0"]
    os.kill(zombie.pid, signal.SIGSTOP)
    frozen = {p["message_id"] for p in admin.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 100, "w0")}
    lab.sleep(stopped_s)
    taken = frozen - {
        p["message_id"] for p in admin.xpending_range(KEYS.jobs, KEYS.group, "-", "+", 100, "w0")
    }
    os.kill(zombie.pid, signal.SIGCONT)
    lab.wait_for(lambda: collect.poll() is not None, COLLECT_TIMEOUT_S + 30, "collect")
    admin.close()
    lab.expect(collect.returncode == 0, f"collect exited {collect.returncode}: {lab.log('collect')[-300:]}")
    lab.expect(bool(taken), "no job of the stopped worker was taken over: nothing was tested")
    lab.notes.append(f"stopped holding {len(frozen)} jobs; {len(taken)} taken over by others while stopped")
    for i in range(workers):
        lab.expect(lab.stop(f"w{i}") == 0, f"worker w{i} did not drain and exit 0")
    return Observed(out, ids)


def maxmemory(lab: Lab, jobs: int = 4000, prompt_len: int = 1000, headroom_mb: float = 3.0) -> Observed:
    """Redis at maxmemory with noeviction: enqueue stops with its summary. Run again while
    workers run, it waits whenever Redis is full; the workers keep results in their outboxes
    meanwhile; `collect` run again and again (each trims what it wrote) makes room, and
    everything completes with the limit unchanged."""
    server = lab.redis()
    admin = redis.Redis.from_url(server.url)
    limit = int(admin.info("memory")["used_memory"] + headroom_mb * 2**20)
    admin.config_set("maxmemory", limit)
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_input(source, jobs, prompt_len)
    first = lab.radixq("enqueue-full", "enqueue", source, "--redis-url", server.url, "--retry-timeout-s", "2")
    text = lab.log("enqueue-full")
    lab.expect(
        first == 2 and "then stopped" in text, f"enqueue into a full Redis: exit {first}, {text[-300:]}"
    )
    lab.expect("Traceback" not in text, "enqueue printed a traceback")
    went_in = admin.hlen(KEYS.enqueued)
    for label in ("w0", "w1"):
        lab.fake_worker(server.url, label, **fake_env(32, 0.01, 5.0))
    refill = lab.start(
        "enqueue-rest", "enqueue", source, "--redis-url", server.url, "--retry-timeout-s", "60"
    )
    rounds = 0
    while True:  # as a user would: collect until enqueue is done and collect has everything
        rounds += 1
        done_before = refill.poll() is not None
        code = lab.radixq(
            f"collect-{rounds}", "collect", "-o", out, "--redis-url", server.url, "--timeout", "10"
        )
        if done_before and code == 0 or rounds == 40:
            break
        lab.sleep(0.5)
    lab.expect(code == 0, f"the last collect exited {code}: {lab.log(f'collect-{rounds}')[-300:]}")
    lab.expect(
        refill.returncode == 0,
        f"the second enqueue exited {refill.returncode}: {lab.log('enqueue-rest')[-300:]}",
    )
    full_writes = sum(lab.log(label).count("Redis is at maxmemory") for label in ("w0", "w1"))
    waits = lab.log("enqueue-rest").count("waiting for Redis")
    lab.notes.append(
        f"first enqueue stopped after {went_in} of {jobs}; the second waited for room {waits} times; "
        f"workers found Redis full {full_writes} times; collect ran {rounds} times; "
        f"maxmemory {limit / 2**20:.1f} MiB throughout"
    )
    lab.expect(admin.config_get("maxmemory")["maxmemory"] == str(limit), "maxmemory changed")
    admin.close()
    for label in ("w0", "w1"):
        lab.expect(lab.stop(label) == 0, f"worker {label} did not drain and exit 0")
    return Observed(out, ids)
