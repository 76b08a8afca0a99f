"""What `radixq cancel` costs on a large backlog, against a private redis-server, no workers.

Enqueues BACKLOG jobs on a routed queue (16 partition streams), the last TAGGED of them with a
tag, then times, in turn: cancel --ids (IDS ids spread over the untagged jobs), cancel --tag
(the tag's jobs), and cancel of the whole queue (the rest). Each is the Python API
(Client.cancel), so the figure is the cancel itself, not the interpreter's start. It also reports
the Redis memory the tag adds per tagged job, and the longest single Redis command of each run
(SLOWLOG), which is what other clients (workers) wait behind.

    python benchmarks/cancel_cost.py --backlog 100000 --tagged 10000 --ids 100
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.cancel import CancelReport  # noqa: E402
from producer.client import Client  # noqa: E402
from producer.local_redis import LocalRedis  # noqa: E402
from wire.schema import Job, SamplingParams  # noqa: E402

SAMPLING = SamplingParams(max_tokens=256)


def jobs(start: int, count: int) -> list[Job]:
    return [
        Job(
            id=f"job-{i:07d}",
            prompt=f"Question {i}: " + "context " * 40,
            sampling=SAMPLING,
            metadata={"row": i},
        )
        for i in range(start, start + count)
    ]


def fill(client: Client, backlog: int, tagged: int) -> int:
    """Enqueue the backlog, the last ``tagged`` jobs with a tag; returns the bytes the tag's
    records take in Redis (MEMORY USAGE of its set and of the tags hash)."""
    client.enqueue(jobs(0, backlog - tagged))
    client.enqueue(jobs(backlog - tagged, tagged), tag="batch")
    keys = client.keys
    return sum(int(client.redis.memory_usage(key, samples=0) or 0) for key in (keys.tags, keys.tag("batch")))


def timed(client: Client, run: Callable[[], CancelReport]) -> tuple[float, CancelReport, float, str]:
    """(seconds, report, the longest Redis command in ms, its name)."""
    client.redis.config_set("slowlog-log-slower-than", 0)
    client.redis.config_set("slowlog-max-len", 100_000)
    client.redis.slowlog_reset()
    start = time.perf_counter()
    report = run()
    seconds = time.perf_counter() - start
    entries = client.redis.slowlog_get(100_000)
    longest = max(entries, key=lambda entry: entry["duration"])
    client.redis.config_set("slowlog-log-slower-than", 10_000)
    name = (
        longest["command"].split()[0].decode()
        if isinstance(longest["command"], bytes)
        else str(longest["command"]).split()[0]
    )
    return seconds, report, longest["duration"] / 1000, name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--tagged", type=int, default=10_000)
    parser.add_argument("--ids", type=int, default=100)
    args = parser.parse_args()
    untagged = args.backlog - args.tagged
    spread = [f"job-{i:07d}" for i in range(0, untagged, max(1, untagged // args.ids))][: args.ids]
    # one backlog, cancelled in three steps that do not overlap: spread ids (none tagged), the
    # tag, then the whole queue (its scan still reads every entry; the others are done by then)
    cases: list[tuple[str, Callable[[Client], CancelReport]]] = [
        (f"--ids ({len(spread)} spread)", lambda c: c.cancel(spread)),
        (f"--tag ({args.tagged} at the tail)", lambda c: c.cancel(tag="batch")),
        ("whole queue (the rest)", lambda c: c.cancel()),
    ]
    rows = []
    with LocalRedis(use_server=True) as server:
        client = Client.from_url(server.url, partitions=16)
        tag_bytes = fill(client, args.backlog, args.tagged)
        for name, case in cases:
            seconds, report, longest_ms, command = timed(client, lambda case=case: case(client))  # type: ignore[misc]
            rows.append((name, report.cancelled, seconds, longest_ms, command))
        client.close()
    print(
        f"backlog {args.backlog} jobs, 16 partitions; the tag costs {tag_bytes / args.tagged:.0f} B per tagged job"
    )
    print(f"{'cancel':<28} {'cancelled':>9} {'seconds':>8} {'jobs/s':>9} {'longest command':>22}")
    for name, cancelled, seconds, longest_ms, command in rows:
        longest = f"{longest_ms:.1f} ms ({command})"
        print(f"{name:<28} {cancelled:>9} {seconds:>8.2f} {cancelled / seconds:>9.0f} {longest:>22}")


if __name__ == "__main__":
    main()
