"""How fast `radixq enqueue` puts a JSONL file with ids into Redis: one producer of the whole
file, and four producers of a quarter each at once, against a private redis-server on this
machine (no persistence: the enqueue path, not the disk).

jobs/s = lines / (the last write - the start): the start is the moment the producers are
launched (`radixq enqueue` subprocesses, interpreter start-up included), the last write the
newest entry any job stream holds (its id is Redis's clock in ms, on the same machine). After
each run every id is checked to be in the streams once, and in the order list once.

With ``--base PATH`` (another checkout, e.g. `git worktree add /tmp/base d566dc8`) each round
runs the base's `radixq enqueue` too, interleaved with this tree's, in the same Redis; the
base runs the first ``--base-rounds`` rounds only (a slow base takes minutes a run).

    python benchmarks/enqueue_speed.py --lines 200000 --rounds 5
    python benchmarks/enqueue_speed.py --lines 200000 --rounds 5 --base /tmp/base --base-rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
from wire.routing import DEFAULT_PARTITIONS  # noqa: E402

KEYS = QueueKeys()  # the default queue, routed over DEFAULT_PARTITIONS streams
GROUPS = 64  # prompt prefix groups (routing spreads them over the partitions)


def write_input(path: Path, lines: int) -> list[str]:
    """``lines`` jobs with ids (about 430 bytes a line), in prefix groups; their ids."""
    ids = [f"job-{i:08d}" for i in range(lines)]
    words = "the of and to in is was for on that with as by at from this be are or an which".split()
    with path.open("w") as out:
        for i, job_id in enumerate(ids):
            opening = f"System: you answer questions about topic {i % GROUPS}. " * 4
            body = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(40))
            row = {
                "id": job_id,
                "prompt": opening + body,
                "max_tokens": 32,
                "temperature": 0.7,
                "metadata": {"row": i},
            }
            out.write(json.dumps(row) + "\n")
    return ids


def split(path: Path, parts: int, folder: Path) -> list[Path]:
    lines = path.read_text().splitlines(keepends=True)
    size = -(-len(lines) // parts)
    pieces = []
    for n in range(parts):
        piece = folder / f"part-{n}.jsonl"
        piece.write_text("".join(lines[n * size : (n + 1) * size]))
        pieces.append(piece)
    return pieces


def last_write_ms(client: redis.Redis) -> int:
    """The ms part of the newest entry id over the job streams (Redis's clock)."""
    newest = 0
    for partition in range(DEFAULT_PARTITIONS):
        try:
            info = client.xinfo_stream(KEYS.partition(partition))
        except redis.ResponseError:
            continue
        newest = max(newest, int(info["last-generated-id"].decode().split("-")[0]))
    return newest


def check_each_id_once(client: redis.Redis, ids: list[str]) -> None:
    seen: list[bytes] = []
    for partition in range(DEFAULT_PARTITIONS):
        stream, start = KEYS.partition(partition), "-"
        while True:
            entries = client.xrange(stream, min=start, count=10_000)
            seen += [fields[b"id"] for _, fields in entries]
            if len(entries) < 10_000:
                break
            start = "(" + entries[-1][0].decode()
    expected = sorted(i.encode() for i in ids)
    assert sorted(seen) == expected, f"{len(seen)} entries for {len(ids)} ids"
    assert sorted(client.lrange(KEYS.order, 0, -1)) == expected, "the order list"


def run(code: Path, files: list[Path], url: str, client: redis.Redis, ids: list[str]) -> tuple[float, float]:
    """One run: the producers of ``files`` at once, from ``code``; (jobs/s to the last write, s
    until every producer exited)."""
    client.flushall()
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.time()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "radixq", "enqueue", str(path), "--redis-url", url],
            cwd=code,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for path in files
    ]
    for proc in procs:
        _, stderr = proc.communicate()
        assert proc.returncode == 0, stderr.decode()[-2000:]
    exited_s = time.time() - start
    check_each_id_once(client, ids)
    return len(ids) / (last_write_ms(client) / 1000 - start), exited_s


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=4, help="producers of the second shape")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base", type=Path, help="another checkout to measure in the same rounds")
    parser.add_argument("--base-rounds", type=int, help="rounds the base runs in (default: all)")
    options = parser.parse_args()
    trees = {"this tree": REPO_ROOT} | ({"base": options.base.resolve()} if options.base else {})
    base_rounds = options.rounds if options.base_rounds is None else options.base_rounds
    figures: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, LocalRedis(use_server=True, appendonly=False) as server:
        folder = Path(tmp)
        whole = folder / "all.jsonl"
        ids = write_input(whole, options.lines)
        shapes = {1: [whole], options.producers: split(whole, options.producers, folder)}
        client = redis.Redis.from_url(server.url)
        print(
            f"{options.lines:,} lines, {whole.stat().st_size / 1e6:.0f} MB; load before: {load()}", flush=True
        )
        for round_no in range(options.rounds):
            for name, code in trees.items():
                if name == "base" and round_no >= base_rounds:
                    continue
                for producers, files in shapes.items():
                    rate, exited_s = run(code, files, server.url, client, ids)
                    figures.setdefault((name, producers), []).append(rate)
                    print(
                        f"round {round_no + 1} {name}: {producers} producer(s): {rate:,.0f} jobs/s "
                        f"(all exited after {exited_s:.1f} s; load {load()})",
                        flush=True,
                    )
        client.close()
    print(f"\nload after: {load()}")
    print("| tree | producers | jobs/s (median) | runs |")
    print("| --- | ---: | ---: | --- |")
    for (name, producers), rates in figures.items():
        runs = ", ".join(f"{rate:,.0f}" for rate in rates)
        print(
            f"| {name} | {producers} x {options.lines // producers:,} lines | {statistics.median(rates):,.0f} | {runs} |"
        )


if __name__ == "__main__":
    main()
