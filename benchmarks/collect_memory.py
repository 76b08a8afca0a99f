"""Peak memory (RSS) of `radixq collect` writing N results, against a private redis-server.

Enqueues N jobs, writes one counted result per job the way a worker's outbox does (result,
done mark), then runs `radixq collect -o OUT --no-wait` as a subprocess and reads its peak
RSS (getrusage of the child). For scale, `radixq status` is measured the same way: the
interpreter plus the imports, with no results held.

    python benchmarks/collect_memory.py --jobs 100000
    python benchmarks/collect_memory.py --jobs 100000 --code /path/to/another/checkout
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.client import Client  # noqa: E402
from producer.local_redis import LocalRedis  # noqa: E402
from wire.keys import FIELD_ENTRY, FIELD_ID, FIELD_RESULT, QueueKeys  # noqa: E402
from wire.schema import Choice, Job, Result, Usage, encode  # noqa: E402


def fill(url: str, count: int) -> None:
    client = Client.from_url(url)
    client.enqueue(Job(id=f"job-{i:06d}", prompt=f"question {i}") for i in range(count))
    keys = QueueKeys()
    entries = client.redis.xrange(keys.jobs)
    for start in range(0, len(entries), 1000):
        with client.redis.pipeline(transaction=False) as pipe:
            for entry, fields in entries[start : start + 1000]:
                job_id = fields[b"id"].decode()
                choice = Choice(
                    index=0, text=f"answer to {job_id} " * 8, token_ids=list(range(64)), finish_reason="stop"
                )
                result = Result(
                    id=job_id, choices=[choice], usage=Usage(prompt_tokens=3, completion_tokens=64)
                )
                pipe.xadd(keys.results, {FIELD_ID: job_id, FIELD_ENTRY: entry, FIELD_RESULT: encode(result)})
                pipe.hsetnx(keys.done, job_id, entry)
            pipe.execute()
    client.close()


def peak_rss_mb(args: list[str], code: Path) -> tuple[float, float, int]:
    """(peak RSS in MB, wall time in s, exit code) of one radixq command run from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixq" if (code / "radixq").is_dir() else "worker.cli", *args],
        cwd=code,
        env=env,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, time.monotonic() - start, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="checkout whose radixq to measure")
    parser.add_argument("--fill", metavar="URL", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.fill:
        fill(options.fill, options.jobs)
        return
    with tempfile.TemporaryDirectory() as tmp, LocalRedis(use_server=True, appendonly=False) as server:
        # NOTE: filled by a child process: a child's peak RSS counts the memory it shared with
        # this process between fork and exec, so this process must stay small.
        subprocess.run(
            [sys.executable, __file__, "--fill", server.url, "--jobs", str(options.jobs)], check=True
        )
        out = Path(tmp) / "out.jsonl"
        base_mb, _, _ = peak_rss_mb(["status", "--redis-url", server.url], options.code)
        collect_mb, wall_s, code = peak_rss_mb(
            ["collect", "-o", str(out), "--no-wait", "--redis-url", server.url], options.code
        )
        rows = out.read_bytes().count(b"\n")
        print(
            f"{options.code}: collect of {rows} results: peak RSS {collect_mb:.0f} MB "
            f"(status: {base_mb:.0f} MB), {wall_s:.1f} s, exit {code}, output {out.stat().st_size / 1e6:.0f} MB"
        )


if __name__ == "__main__":
    main()
