"""``radixq run``: one file in, one file out - enqueue, start workers, collect, shut down.

Workers are ``radixq worker`` subprocesses (``python -m producer.cli worker``). With no Redis
URL a private Redis is started for the run (LocalRedis) and removed afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from producer.client import Client
from producer.collector import Collector, CollectReport
from producer.jsonl import InputFile, read_jobs, written_ids
from producer.local_redis import LocalRedis


@dataclass(frozen=True)
class RunOptions:
    input_path: Path
    output_path: Path
    queue: str = "default"
    redis_url: str | None = None  # None: a private Redis for this run
    num_workers: int = 1
    worker_args: list[str] = field(default_factory=list)  # passed to each `radixq worker`
    timeout_s: float | None = None
    drain_timeout_s: float = 30.0


@dataclass(frozen=True)
class RunReport:
    parsed: InputFile
    enqueued: int
    skipped: int
    resumed: int  # ids already in the output file, not run again
    collected: CollectReport | None


def worker_command(queue: str, redis_url: str, name: str, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "producer.cli",
        "worker",
        "--queue",
        queue,
        "--redis-url",
        redis_url,
        "--name",
        name,
        *extra,
    ]


def run_file(options: RunOptions, say: Callable[[str], None] = print) -> RunReport:
    """Run every valid line of the input file and write the output file (resuming it)."""
    parsed = read_jobs(options.input_path)
    for rejected in parsed.rejected:
        say(f"rejected {rejected}")
    already = written_ids(options.output_path)
    jobs = [job for job in parsed.jobs if job.id not in already]
    if already:
        say(f"resuming: {len(parsed.jobs) - len(jobs)} jobs already in {options.output_path}")
    if not jobs:
        return RunReport(parsed, 0, 0, len(parsed.jobs) - len(jobs), None)
    with ExitStack() as stack:
        redis_url = options.redis_url
        if redis_url is None:
            local = stack.enter_context(LocalRedis(appendonly=False))  # removed after the run
            redis_url = local.url
            say(f"started a private {local.kind} at {redis_url}")
        client = Client.from_url(redis_url, options.queue)
        stack.callback(client.close)
        report = client.enqueue(jobs)
        say(
            f"enqueued {len(report.enqueued)}, skipped {len(report.skipped)} (already enqueued), rejected {len(parsed.rejected)}"
        )
        workers = _start_workers(options, redis_url)
        stack.callback(_stop_workers, workers, options.drain_timeout_s + 10.0)
        collected = Collector(client.redis, options.queue).collect(
            options.output_path,
            ids=[job.id for job in jobs],
            wait=True,
            timeout_s=options.timeout_s,
            should_stop=lambda: all(proc.poll() is not None for proc in workers),
        )
        if collected.missing and all(proc.poll() is not None for proc in workers):
            codes = [proc.returncode for proc in workers]
            say(f"all workers exited (codes {codes}) with {len(collected.missing)} jobs unfinished")
        return RunReport(parsed, len(report.enqueued), len(report.skipped), len(already), collected)


def _start_workers(options: RunOptions, redis_url: str) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ)
    env.pop("REDIS_URL", None)  # the --redis-url argument is the one to use
    return [
        subprocess.Popen(
            worker_command(options.queue, redis_url, f"run-{os.getpid()}-{i}", options.worker_args),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        for i in range(options.num_workers)
    ]


def _stop_workers(workers: list[subprocess.Popen[bytes]], wait_s: float) -> None:
    for proc in workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in workers:
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
