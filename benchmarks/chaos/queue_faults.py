"""Queue scenarios: `radixq worker` processes with the fake generator (tests/fake_generator.py,
slowed by RADIXQ_FAKE_LATENCY_S) against a private redis-server, and workers that die or
freeze. Each returns what it observed (benchmarks.chaos.lab.Observed). The helpers here serve the
Redis scenarios (benchmarks.chaos.redis_faults) too.

Every scenario enqueues a file with `radixq enqueue` and collects with `radixq collect`
running in the background from the start, as a user would.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from benchmarks.chaos.lab import KEYS, Lab, line_count
from benchmarks.chaos.row import Observed
from tests.jobs_stream import pending_entries, stream_of
from wire.keys import FIELD_ID

COLLECT_TIMEOUT_S = 600  # far above any run here: a timeout means the scenario stalled
# What collect says when Redis lost the queue's data (wire.epoch, producer.collector).
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
    return len(pending_entries(client, KEYS, name))


def data_loss_reports(lab: Lab, labels: list[str]) -> list[str]:
    return [f"worker {label} logged DATA LOSS" for label in labels if "DATA LOSS" in lab.log(label)]


def finish_collect(
    lab: Lab, collect: Any, sources: list[Path], out: Path, url: str, ids: list[str]
) -> tuple[int, list[str]]:
    """Wait for the background collect; after a loss it reported, recover as documented (enqueue
    the input files again, collect again into the same output). Returns (ids with no row
    before the recovery, how the loss was reported)."""
    lab.wait_for(lambda: collect.poll() is not None, COLLECT_TIMEOUT_S + 30, "collect to exit")
    text = lab.log("collect")
    if collect.returncode == 0:
        return 0, []
    written = {json.loads(line)["id"] for line in out.read_text().splitlines()} if out.exists() else set()
    missing = sum(i not in written for i in ids)
    said = [phrase for phrase in LOSS_PHRASES if phrase in text]
    detected = []
    if collect.returncode == 1 and said and "enqueue the same input file again" in text:
        detected.append(f"collect exit 1: '{said[0]}'")
    else:
        lab.problems.append(f"collect exited {collect.returncode}: {text[-400:]}")
    for i, source in enumerate(sources):
        enqueue(lab, f"enqueue-again-{i}", source, url)
    again = lab.radixq(
        "collect-again", "collect", "-o", out, "--redis-url", url, "--timeout", str(COLLECT_TIMEOUT_S)
    )
    lab.expect(again == 0, f"collect after the recovery exited {again}: {lab.log('collect-again')[-300:]}")
    return missing, detected


def kill9_chaos(
    lab: Lab,
    jobs: int = 2000,
    workers: int = 3,
    period_s: tuple[float, float] = (1.0, 2.0),
    latency_s: float = 0.05,
    capacity: int = 8,
    min_idle_s: float = 2.0,
    max_attempts: int = 3,
    max_kills: int | None = None,
    seed: int = 8,
) -> Observed:
    """Several workers; every one to two seconds a random one of those holding jobs is
    kill -9'd and a new one started, until collect has every result (or ``max_kills``).

    NOTE: a job is dead-lettered once ``max_attempts`` of the workers holding it died (radixq
    cannot tell a job that kills its worker from a worker killed by something else), so the
    expected dead letters are exactly the jobs that max_attempts killed workers held, read
    from each victim's pending list right after its death."""
    server = lab.redis()
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_input(source, jobs)
    enqueue(lab, "enqueue", source, server.url)
    env = fake_env(capacity, latency_s, min_idle_s)
    extra = ("--max-attempts", str(max_attempts))
    pool = {f"w{i}": lab.fake_worker(server.url, f"w{i}", *extra, **env) for i in range(workers)}
    collect = collect_in_background(lab, "collect", out, server.url)
    admin = redis.Redis.from_url(server.url)
    rng = random.Random(seed)
    kills = 0
    killed_holding: Counter[str] = Counter()  # job id -> killed workers that held it
    while True:
        lab.sleep(rng.uniform(*period_s))
        if collect.poll() is not None or kills == max_kills:
            break
        holding = {name: held_by(admin, name) for name in sorted(pool)}
        if not any(holding.values()):
            continue  # the others are still starting (a worker takes 1-3 s to start here)
        victim = rng.choice([name for name, count in holding.items() if count])
        proc = pool.pop(victim)
        proc.kill()
        proc.wait()
        killed_holding.update(held_job_ids(admin, victim))  # frozen until min_idle passes
        kills += 1
        name = f"w{workers + kills - 1}"
        pool[name] = lab.fake_worker(server.url, name, *extra, **env)
    lab.wait_for(lambda: collect.poll() is not None, COLLECT_TIMEOUT_S, "collect to finish")
    admin.close()
    culprits = sorted(job for job, count in killed_holding.items() if count >= max_attempts)
    code = 1 if culprits else 0  # collect exits 1 when it wrote error rows
    lab.expect(
        collect.returncode == code, f"collect exited {collect.returncode}: {lab.log('collect')[-300:]}"
    )
    lab.facts.update(kills=kills, held=sum(killed_holding.values()))
    lab.notes.append(
        f"{kills} workers killed holding {sum(killed_holding.values())} jobs in all; "
        f"{len(culprits)} jobs were held by {max_attempts} killed workers (max_attempts)"
    )
    for name in pool:
        lab.wait_for(lambda: "consuming" in lab.log(name), 30, f"worker {name} to start")  # noqa: B023
        lab.expect(lab.stop(name) == 0, f"worker {name} did not drain and exit 0")
    return Observed(out, ids, culprits=culprits)


def held_job_ids(client: redis.Redis, consumer: str) -> list[str]:
    """The job ids of the entries pending on ``consumer``."""
    with client.pipeline(transaction=False) as pipe:
        for info in pending_entries(client, KEYS, consumer):
            pipe.xrange(*stream_of(info["message_id"], KEYS), *stream_of(info["message_id"], KEYS)[1:])
        entries: Any = pipe.execute()
    return [found[0][1][FIELD_ID.encode()].decode() for found in entries if found]


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
    frozen = {p["message_id"] for p in pending_entries(admin, KEYS, "w0")}
    lab.sleep(stopped_s)
    taken = frozen - {p["message_id"] for p in pending_entries(admin, KEYS, "w0")}
    os.kill(zombie.pid, signal.SIGCONT)
    lab.wait_for(lambda: collect.poll() is not None, COLLECT_TIMEOUT_S + 30, "collect")
    admin.close()
    lab.expect(collect.returncode == 0, f"collect exited {collect.returncode}: {lab.log('collect')[-300:]}")
    lab.facts.update(frozen=len(frozen), taken_over=len(taken))
    lab.expect(bool(taken), "no job of the stopped worker was taken over: nothing was tested")
    lab.notes.append(f"stopped holding {len(frozen)} jobs; {len(taken)} taken over by others while stopped")
    for i in range(workers):
        lab.expect(lab.stop(f"w{i}") == 0, f"worker w{i} did not drain and exit 0")
    return Observed(out, ids)
