"""collect draining a routed queue as results arrive (issue 30), with the fake generator.

Each scenario runs `radixq worker` and `radixq collect` subprocesses of a checkout (``--code``,
default this one: give another checkout, e.g. ``git worktree add /tmp/base d566dc8``, to measure
it the same way) against a private redis-server, two workers with the fake generator
(tests/fake_generator.py), and checks the output: every id once, in input order.

    maxmemory  the issue's reproduction: N jobs (n=8, latency 0.05 s), Redis at maxmemory 4 MiB
               above what the queue holds; collect's wall time routed (16 partitions) and with
               --no-routing, and their ratio
    stream     N routed jobs (latency 0.05 s) collected as they finish; the results stream's
               length sampled every second: its maximum is what Redis held of the results
    producers  `collect --wait --expect N` started before 4 `radixq enqueue` of N/4 lines each
               (one input split in four) and two workers (latency 0): rows written, exit code

    python benchmarks/collect_drain.py maxmemory --jobs 10000
    python benchmarks/collect_drain.py stream --jobs 20000 [--code /tmp/base]
    python benchmarks/collect_drain.py producers --jobs 200000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.client import Client  # noqa: E402
from producer.local_redis import LocalRedis  # noqa: E402
from wire.keys import QueueKeys  # noqa: E402
from wire.schema import Job, SamplingParams  # noqa: E402

FAKE_GENERATOR = "tests.fake_generator:create_generator"
KEYS = QueueKeys()


def radixq(code: Path, *args: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """A radixq command of the checkout ``code``, in the background."""
    environ = {**os.environ, "PYTHONPATH": str(code), "RADIXQ_LOG_LEVEL": "WARNING", **env}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "radixq", *args],
            cwd=code,
            env=environ,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def start_workers(code: Path, url: str, tmp: Path, **env: str) -> list[subprocess.Popen[bytes]]:
    return [
        radixq(code, "worker", "--redis-url", url, "--name", f"w{i}", "--generator", FAKE_GENERATOR,
               log=tmp / f"w{i}.log", **env)
        for i in range(2)
    ]  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=120)


def check_output(out: Path, ids: list[str]) -> None:
    written = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    if written != ids:
        dupes = len(written) - len(set(written))
        raise SystemExit(f"{out}: {len(written)} rows ({dupes} repeated), not the {len(ids)} ids in order")


def enqueue(url: str, ids: list[str], partitions: int, n: int = 1) -> None:
    client = Client.from_url(url, partitions=partitions)
    client.enqueue(
        (Job(id=job_id, prompt=f"question {job_id}", sampling=SamplingParams(n=n)) for job_id in ids),
        keep_ids=False,
    )
    client.close()


def collect(code: Path, url: str, out: Path, tmp: Path, *extra: str) -> tuple[int, float]:
    """(exit code, wall seconds) of one collect, quiet, until it exits."""
    start = time.monotonic()
    proc = radixq(
        code, "collect", "-o", str(out), "--redis-url", url, "--quiet", *extra, log=tmp / "collect.log"
    )
    code_ = proc.wait()
    return code_, time.monotonic() - start


def maxmemory(code: Path, jobs: int, tmp: Path) -> None:
    ids = [f"m{i:06d}" for i in range(jobs)]
    times = {}
    for name, partitions in (("routed (16 partitions)", 16), ("--no-routing", 0)):
        with LocalRedis(use_server=True, appendonly=False) as server:
            enqueue(server.url, ids, partitions, n=8)
            admin = redis.Redis(port=server.port)
            admin.config_set("maxmemory", admin.info("memory")["used_memory"] + 4 * 1024 * 1024)
            workers = start_workers(code, server.url, tmp, RADIXQ_FAKE_LATENCY_S="0.05")
            out = tmp / f"out-{partitions}.jsonl"
            rc, seconds = collect(code, server.url, out, tmp, "--retry-timeout-s", "600")
            stop(workers)
            admin.close()
        check_output(out, ids)
        times[name] = seconds
        print(f"| {name} | {jobs:,} | {rc} | {seconds:.1f} s |", flush=True)
    ratio = times["routed (16 partitions)"] / times["--no-routing"]
    print(f"\nrouted / --no-routing: {ratio:.2f}x")


def stream(code: Path, jobs: int, tmp: Path) -> None:
    ids = [f"s{i:06d}" for i in range(jobs)]
    with LocalRedis(use_server=True, appendonly=False) as server:
        enqueue(server.url, ids, partitions=16)
        admin = redis.Redis(port=server.port)
        lengths: list[int] = []
        stopping = threading.Event()

        def sample() -> None:
            while not stopping.wait(1.0):
                lengths.append(int(admin.xlen(KEYS.results)))

        sampler = threading.Thread(target=sample, daemon=True)
        out = tmp / "out.jsonl"
        workers = start_workers(code, server.url, tmp, RADIXQ_FAKE_LATENCY_S="0.05")
        sampler.start()
        rc, seconds = collect(code, server.url, out, tmp)
        stopping.set()
        sampler.join()
        stop(workers)
        admin.close()
    check_output(out, ids)
    print(f"| {code} | {jobs:,} | {rc} | {seconds:.1f} s | {len(lengths)} | {max(lengths, default=0):,} |")


def producers(code: Path, jobs: int, tmp: Path) -> None:
    files, ids = [], []
    for k in range(4):
        source = tmp / f"in{k}.jsonl"
        part = [f"p{k}-{i:06d}" for i in range(jobs // 4)]
        source.write_text("".join(json.dumps({"id": i, "prompt": f"question {i}"}) + "\n" for i in part))
        files.append(source)
        ids += part
    with LocalRedis(use_server=True, appendonly=False) as server:
        out = tmp / "out.jsonl"
        start = time.monotonic()
        collector = radixq(code, "collect", "-o", str(out), "--redis-url", server.url, "--quiet",
                           "--expect", str(len(ids)), log=tmp / "collect.log")  # fmt: skip
        enqueues = [
            radixq(code, "enqueue", str(f), "--redis-url", server.url, log=tmp / "enq.log") for f in files
        ]
        workers = start_workers(code, server.url, tmp)
        codes = [proc.wait() for proc in enqueues]
        enqueued_s = time.monotonic() - start
        rc = collector.wait()
        seconds = time.monotonic() - start
        stop(workers)
    written = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    once = len(written) == len(set(written)) == len(ids) and set(written) == set(ids)
    print(
        f"| {len(ids):,} | {codes} | {enqueued_s:.0f} s | {rc} | {len(written):,} | {once} | {seconds:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=["maxmemory", "stream", "producers"])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="checkout whose radixq to run")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="radixq-drain-") as tmp:
        if options.scenario == "maxmemory":
            print("| queue | jobs | collect rc | collect wall |\n| --- | ---: | ---: | ---: |")
            maxmemory(options.code, options.jobs, Path(tmp))
        elif options.scenario == "stream":
            print("| code | jobs | collect rc | wall | samples | results stream max |")
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            stream(options.code, options.jobs, Path(tmp))
        else:
            print("| jobs | enqueue rcs | enqueued after | collect rc | rows | each id once | wall |")
            print("| ---: | --- | ---: | ---: | ---: | --- | ---: |")
            producers(options.code, options.jobs, Path(tmp))


if __name__ == "__main__":
    main()
