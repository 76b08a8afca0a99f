"""What a queue leaves in Redis once its jobs are collected: used_memory, and per key.

Against a private redis-server: one job is enqueued, run and collected (with `--trim`, the
default) to make the queue exist, and Redis's used_memory is read: the empty queue. Then N
jobs are enqueued, run by 2 fake-generator `radixq worker`s (which trim the jobs stream), and
collected into the same output; once the workers have stopped, used_memory is read again, and
the memory of each of the queue's keys (MEMORY USAGE). `--code` measures another checkout.

    python benchmarks/redis_retention.py --jobs 100000
    python benchmarks/redis_retention.py --jobs 100000 --code /path/to/another/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.local_redis import LocalRedis  # noqa: E402
from wire.keys import QueueKeys  # noqa: E402


def radixq(code: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(code)}
    subprocess.run(
        [sys.executable, "-m", "radixq" if (code / "radixq").is_dir() else "worker.cli", *args],
        cwd=code,
        env=env,
        check=True,
        capture_output=True,
    )


def run_jobs(code: Path, url: str, source: Path, out: Path, count: int) -> None:
    source.write_text(
        "".join(json.dumps({"id": f"j{i:07d}", "prompt": f"question {i}"}) + "\n" for i in count)
    )
    radixq(code, "enqueue", str(source), "--redis-url", url)
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "RADIXQ_FAKE_CAPACITY": "64",
        "RADIXQ_HOUSEKEEPING_S": "0.5",
    }
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "radixq" if (code / "radixq").is_dir() else "worker.cli",
                "worker",
                "--redis-url",
                url,
                "--name",
                f"w{i}",
            ]
            + ["--generator", "tests.fake_generator:create_generator"],
            cwd=code,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(2)
    ]
    try:
        radixq(code, "collect", "-o", str(out), "--redis-url", url, "--quiet")
        client = redis.Redis.from_url(url)
        keys = QueueKeys()
        deadline = time.monotonic() + 60
        while client.xlen(keys.jobs) and time.monotonic() < deadline:  # the workers' housekeeping trims it
            time.sleep(0.2)
        client.close()
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)


def used_memory(url: str) -> tuple[int, dict[str, int]]:
    client = redis.Redis.from_url(url)
    per_key = {key.decode(): int(client.memory_usage(key) or 0) for key in client.scan_iter("radixq:*")}
    used = int(client.info("memory")["used_memory"])
    client.close()
    return used, per_key


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="checkout whose radixq to measure")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalRedis(use_server=True, appendonly=False) as server:
        out = Path(tmp) / "out.jsonl"
        run_jobs(options.code, server.url, Path(tmp) / "one.jsonl", out, range(1))
        empty, empty_keys = used_memory(server.url)
        started = time.monotonic()
        run_jobs(options.code, server.url, Path(tmp) / "many.jsonl", out, range(1, options.jobs + 1))
        after, after_keys = used_memory(server.url)
        rows = sum(1 for _ in open(out))
    print(f"{rows:,} rows collected in {time.monotonic() - started:.0f} s")
    print(
        f"used_memory: empty queue {empty / 2**20:.2f} MiB, after {options.jobs:,} jobs {after / 2**20:.2f} MiB"
    )
    print(f"difference: {(after - empty) / 2**20:+.2f} MiB")
    print("| key | empty queue (bytes) | after (bytes) |")
    print("|---|---|---|")
    for key in sorted(set(empty_keys) | set(after_keys)):
        print(f"| `{key}` | {empty_keys.get(key, 0):,} | {after_keys.get(key, 0):,} |")


if __name__ == "__main__":
    main()
