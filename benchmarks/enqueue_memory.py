"""Peak memory (RSS) of `radixq enqueue` against the size of its input, against a private redis-server.

Writes JSONL inputs of each size (prompts of about 300 characters; with explicit ids, or
without: then ids are derived from the line), runs `radixq enqueue FILE` as a subprocess for
each and reads its peak RSS (getrusage of the child). `radixq status` is measured the same way
for scale: the interpreter and the imports. A streaming enqueue holds one batch of rows, plus
one entry per explicit id (duplicate detection): its RSS grows by that entry per line, and
not at all without ids.

    python benchmarks/enqueue_memory.py --lines 50000 200000 800000
    python benchmarks/enqueue_memory.py --code /path/to/another/checkout
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.local_redis import LocalRedis  # noqa: E402


def write_input(path: Path, lines: int, with_ids: bool) -> None:
    prompt = "Summarise the following passage in one sentence. " * 6
    with open(path, "w") as out:
        for i in range(lines):
            row = {"id": f"row-{i:08d}"} if with_ids else {}
            row.update(prompt=f"{prompt}#{i}", max_tokens=64)
            out.write(json.dumps(row) + "\n")


def peak_rss_mb(args: list[str], code: Path) -> tuple[float, float, int]:
    """(peak RSS in MB, wall time in s, exit code) of one radixq command run from ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixq" if (code / "radixq").is_dir() else "worker.cli", *args],
        cwd=code,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    return usage.ru_maxrss / 1024, time.monotonic() - start, os.waitstatus_to_exitcode(status)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, nargs="+", default=[50_000, 200_000, 800_000])
    parser.add_argument("--code", type=Path, default=REPO_ROOT, help="checkout whose radixq to measure")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalRedis(use_server=True, appendonly=False) as server:
        base_mb, _, _ = peak_rss_mb(["status", "--redis-url", server.url], options.code)
        print(f"radixq status (interpreter + imports): {base_mb:.0f} MB")
        print("| lines | ids | input MB | peak RSS MB | above status MB | s | exit |")
        print("|---|---|---|---|---|---|---|")
        for lines in options.lines:
            for with_ids in (False, True):
                source = Path(tmp) / f"in-{lines}-{with_ids}.jsonl"
                write_input(source, lines, with_ids)
                queue = f"bench-{lines}-{int(with_ids)}"
                args = ["enqueue", str(source), "--redis-url", server.url, "--queue", queue]
                rss_mb, wall_s, code = peak_rss_mb(args, options.code)
                size_mb = source.stat().st_size / 1e6
                ids = "explicit" if with_ids else "derived"
                print(
                    f"| {lines:,} | {ids} | {size_mb:.0f} | {rss_mb:.0f} | {rss_mb - base_mb:.0f} "
                    f"| {wall_s:.1f} | {code} |",
                    flush=True,
                )
                source.unlink()
                subprocess.run(  # NOTE: one queue at a time in Redis: its memory is not measured here
                    ["redis-cli", "-p", str(server.port), "FLUSHALL"], check=True, stdout=subprocess.DEVNULL
                )


if __name__ == "__main__":
    main()
