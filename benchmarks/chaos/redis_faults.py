"""Redis scenarios: Redis killed, restarted without its data or from an older AOF, and full
(maxmemory with noeviction), under fake-generator workers and a running `collect`. Where Redis
lost writes, the loss must be reported (by collect or a worker) and is recovered the
documented way: enqueue the same input again, collect again into the same output.
"""

from __future__ import annotations

import os
import shutil
import signal

import redis

from benchmarks.chaos.lab import KEYS, Lab, line_count
from benchmarks.chaos.queue_faults import (
    collect_in_background,
    data_loss_reports,
    enqueue,
    fake_env,
    finish_collect,
    write_input,
)
from benchmarks.chaos.row import Observed
from producer.client import Client
from producer.jsonl import read_jobs


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
    missing, detected = finish_collect(lab, collect, [source], out, server.url, ids)
    detected += data_loss_reports(lab, labels)
    if appendonly and fsync == "always":
        lab.expect(not detected, f"an AOF with fsync always lost writes: {detected}")
        return Observed(out, ids)
    return Observed(out, ids, missing_before=missing, detected=detected)


def redis_rolled_back(lab: Lab, jobs: int = 2000, later: int = 500, latency_s: float = 0.2) -> Observed:
    """What a machine crash with appendfsync everysec loses: the last second. A second file is
    enqueued (enqueue says it went in); a second later Redis is kill -9'd and started from a
    copy of its AOF taken just before that enqueue. The loss must be reported; enqueueing both
    files again and collecting into the same output completes every job once. (A kill -9 of
    Redis alone does not lose the second: the kernel still has what Redis wrote.)

    NOTE: the first file must still be running when the second goes in, or the collect ends
    before the second file exists and nothing is lost. The workers are stopped (SIGSTOP) from
    the copy until the second file is in, so that holds however slow the copy and the enqueue
    are (on a loaded box they took 7 s, longer than the rest of the first file)."""
    server = lab.redis(fsync="everysec")
    first, second, out = lab.dir / "in.jsonl", lab.dir / "later.jsonl", lab.dir / "out.jsonl"
    ids = write_input(first, jobs)
    later_ids = [f"later{i:05d}" for i in range(later)]
    second.write_text("".join(f'{{"id": "{i}", "prompt": "y", "max_tokens": 4}}\n' for i in later_ids))
    enqueue(lab, "enqueue", first, server.url)
    labels = ["w0", "w1"]
    for label in labels:
        lab.fake_worker(server.url, label, **fake_env(8, latency_s, 5.0))
    collect = collect_in_background(lab, "collect", out, server.url)
    lab.wait_for(lambda: line_count(out) >= jobs // 4, 60, "a quarter of the results")
    for label in labels:
        os.kill(lab.procs[label].pid, signal.SIGSTOP)
    aof = server.data_dir / "appendonlydir"
    shutil.copytree(aof, lab.dir / "aof-copy")
    admin = redis.Redis.from_url(server.url)
    Client(admin).enqueue(read_jobs(second).jobs)  # in process: the copy is a second old at the kill
    lab.expect(line_count(out) < jobs, "the first file was done before the second went in: nothing was tested")
    for label in labels:
        os.kill(lab.procs[label].pid, signal.SIGCONT)
    lab.sleep(1.0)  # the workers write results and done marks the rollback will lose
    before = admin.hlen(KEYS.done), admin.llen(KEYS.order)
    server.kill()
    shutil.rmtree(aof)
    shutil.copytree(lab.dir / "aof-copy", aof)
    lab.restart(server)
    after = admin.hlen(KEYS.done), admin.llen(KEYS.order)
    admin.close()
    lab.notes.append(
        f"Redis went back from {before[1]} enqueued ids and {before[0]} done marks to {after[1]} and {after[0]}"
    )
    missing, detected = finish_collect(lab, collect, [first, second], out, server.url, [*ids, *later_ids])
    detected += data_loss_reports(lab, labels)
    return Observed(out, [*ids, *later_ids], missing_before=missing, detected=detected)


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
