"""Queue-path throughput with the fake generator: how fast jobs go through Redis, not the engine.

Measures, against a private redis-server (AOF on, appendfsync everysec as in docker-compose):
- parse+validate rate of a JSONL file (jobs/s),
- enqueue rate (pipelined, idempotent XADD batches; jobs/s),
- end to end: N `radixq worker` subprocesses with the fake generator (zero latency) and a
  collector writing the output file, from worker start until the last result is written.

    python benchmarks/queue_throughput.py --jobs 50000 --workers 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.client import Client  # noqa: E402
from producer.collector import Collector  # noqa: E402
from producer.jsonl import read_jobs  # noqa: E402
from producer.local_redis import LocalRedis  # noqa: E402

FAKE_GENERATOR = "tests.fake_generator:create_generator"


def write_input(path: Path, count: int) -> None:
    with open(path, "w") as out:
        for i in range(count):
            if i % 2:
                line = {"id": f"job-{i}", "prompt": f"Question {i}: what is {i} plus {i}?", "max_tokens": 16}
            else:
                line = {
                    "id": f"job-{i}",
                    "messages": [{"role": "user", "content": f"Say {i}."}],
                    "temperature": 0,
                }
            out.write(json.dumps(line) + "\n")


def run_workers(
    url: str, queue: str, count: int, capacity: int, log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "RADIXQ_FAKE_CAPACITY": str(capacity),
        "RADIXQ_LOG_LEVEL": "WARNING",
    }
    procs = []
    for i in range(count):
        log = open(log_dir / f"worker-{queue}-{i}.log", "wb")  # noqa: SIM115
        cmd = [sys.executable, "-m", "radixq", "worker", "--redis-url", url, "--queue", queue]
        cmd += ["--name", f"bench-{i}", "--generator", FAKE_GENERATOR]
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts to try")
    parser.add_argument("--capacity", type=int, default=256, help="fake generator slots per worker")
    args = parser.parse_args()

    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix="radixq-bench-") as tmp, LocalRedis(fsync="everysec") as server:
        tmp_dir = Path(tmp)
        source = tmp_dir / "in.jsonl"
        write_input(source, args.jobs)
        for num_workers in [int(n) for n in args.workers.split(",")]:
            queue = f"bench{num_workers}"
            client = Client.from_url(server.url, queue)
            t0 = time.perf_counter()
            parsed = read_jobs(source)
            t1 = time.perf_counter()
            report = client.enqueue(parsed.jobs)
            t2 = time.perf_counter()
            assert len(report.enqueued) == args.jobs and not parsed.rejected
            workers = run_workers(server.url, queue, num_workers, args.capacity, tmp_dir)
            out = tmp_dir / f"out-{queue}.jsonl"
            t3 = time.perf_counter()
            collected = Collector(client.redis, queue).collect(out, wait=True, timeout_s=600)
            t4 = time.perf_counter()
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            for proc in workers:
                proc.wait(timeout=60)
            assert not collected.missing, f"{len(collected.missing)} jobs missing"
            assert sum(1 for _ in open(out)) == args.jobs
            client.close()
            if not rows:
                rows.append(
                    ("parse + validate JSONL", f"{args.jobs / (t1 - t0):,.0f} jobs/s", f"{t1 - t0:.2f} s")
                )
                rows.append(
                    ("enqueue (pipelined XADD)", f"{args.jobs / (t2 - t1):,.0f} jobs/s", f"{t2 - t1:.2f} s")
                )
            rows.append(
                (
                    f"end to end, {num_workers} worker(s)",
                    f"{args.jobs / (t4 - t3):,.0f} jobs/s",
                    f"{t4 - t3:.2f} s",
                )
            )

    print(
        f"\nQueue path, {args.jobs:,} jobs, fake generator (capacity {args.capacity}), private redis-server"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    print("| measure | rate | time |")
    print("| --- | ---: | ---: |")
    for name, rate, seconds in rows:
        print(f"| {name} | {rate} | {seconds} |")


if __name__ == "__main__":
    main()
