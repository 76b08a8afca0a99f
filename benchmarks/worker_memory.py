"""Peak RSS of a CPU worker's processes during `radixq run`: the front end and its engine.

Writes N prompts (a short story each, ``--max-tokens`` tokens, EOS ignored), runs
`radixq run --device cpu --workers W` on them as a subprocess and samples the VmRSS of every
process under it once a second (/proc), then prints each process's peak by role.

    python benchmarks/worker_memory.py --jobs 24
    python benchmarks/worker_memory.py --jobs 200 --workers 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found through /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def rss_mb_and_role(pid: int) -> tuple[float, str] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    role = "engine" if "worker.scheduler.main" in cmdline else "front end" if " worker " in cmdline else ""
    return kib / 1024, role


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "jobs.jsonl", Path(tmp) / "out.jsonl"
        source.write_text(
            "".join(
                json.dumps(
                    {"id": f"j{i}", "prompt": f"Write a short story about the number {i}.",
                     "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
                ) + "\n"
                for i in range(args.jobs)
            )
        )  # fmt: skip
        command = [sys.executable, "-m", "radixq", "run", str(source), "-o", str(out), "--quiet"]
        command += ["--device", "cpu", "--workers", str(args.workers)]
        run = subprocess.Popen(command, cwd=REPO_ROOT, stderr=subprocess.DEVNULL)
        peaks: dict[int, tuple[float, str]] = {}
        while run.poll() is None:
            for pid in descendants(run.pid):
                seen = rss_mb_and_role(pid)
                if seen is not None and seen[1]:
                    peaks[pid] = (max(seen[0], peaks.get(pid, (0.0, ""))[0]), seen[1])
            time.sleep(1.0)
        rows = len(out.read_text().splitlines()) if out.exists() else 0
    report = {
        "jobs": args.jobs,
        "workers": args.workers,
        "exit_code": run.returncode,
        "rows": rows,
        "peak_rss_mb": sorted((role, round(mb)) for mb, role in peaks.values()),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
