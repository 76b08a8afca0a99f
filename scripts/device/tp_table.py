"""The short table scripts/device/tp_checks.sh prints last, from what its parts left in OUT.

    python3 scripts/device/tp_table.py OUT PART=STATUS...

nccl / kill: pytest's summary line (and the restart's timings); pool: the median wall time of
1 and 2 workers and their ratio (the issue's bar: >= 1.8x); atscale: each variant's median
output tokens/s and its ratio to the one-worker TP=1 queue run of the same call.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|skipped|error).*) in [\d.]+s", re.MULTILINE)


def log_of(out: Path, part: str) -> str:
    path = out / f"tp_{part}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def pytest_result(out: Path, part: str) -> str:
    log = log_of(out, part)
    found = PYTEST_SUMMARY.findall(log)
    result = found[-1][0] if found else "no pytest summary"
    restart = re.findall(r"^kill -9 of rank 1: .*$", log, re.MULTILINE)
    return result + (f"; {restart[-1]}" if restart else "")


def pool_result(out: Path) -> tuple[str, list[str]]:
    path = out / "tp_pool.json"
    if path.exists():
        runs = json.loads(path.read_text())["runs"]
    else:  # cut off before its end: the runs it printed, one JSON object a line
        runs = [
            json.loads(line) for line in log_of(out, "pool").splitlines() if line.startswith('{"partitions"')
        ]
    walls: dict[int, list[float]] = {}
    for run in runs:
        walls.setdefault(run["workers"], []).append(run["wall_s"])
    rows = [
        f"| {w} | {', '.join(f'{s:.2f}' for s in ws)} | {statistics.median(ws):.2f} s | "
        f"{100 * statistics.median(r['of_ideal'] for r in runs if r['workers'] == w):.1f}% |"
        for w, ws in sorted(walls.items())
    ]
    if 1 in walls and 2 in walls:
        ratio = statistics.median(walls[1]) / statistics.median(walls[2])
        summary = f"2 workers {ratio:.2f}x 1 worker (bar >= 1.8x: {'met' if ratio >= 1.8 else 'NOT met'})"
    else:
        summary = "no pair of 1- and 2-worker runs"
    head = ["| workers | runs (s) | median | cached of ideal |", "| ---: | --- | ---: | ---: |"]
    return summary, head + rows if rows else []


def atscale_result(out: Path) -> tuple[str, list[str]]:
    path = out / "tp_atscale.json"
    if not path.exists():
        return "no tp_atscale.json", []
    report = json.loads(path.read_text())
    by_variant: dict[str, list[dict]] = {}
    for run in report["runs"]:
        by_variant.setdefault(run["variant"], []).append(run)
    medians = {
        v: statistics.median(r["output_tokens"] / r["seconds"] for r in runs)
        for v, runs in by_variant.items()
    }
    base = next((tok for v, tok in medians.items() if v.split(" ")[0] == "queue"), None)
    rows = ["| variant | runs (s) | median tok/s | vs one TP=1 worker |", "| --- | --- | ---: | ---: |"]
    for v, runs in by_variant.items():
        ratio = f"{medians[v] / base:.2f}x" if base else "-"
        seconds = ", ".join(f"{r['seconds']:.2f}" for r in runs)
        rows.append(f"| {v} | {seconds} | {medians[v]:,.0f} | {ratio} |")
    args = report["args"]
    summary = (
        f"{args['preset']}, {args.get('num_requests') or 'preset'} requests x "
        f"{args.get('prompt_len') or 'preset'}/{args.get('output_len') or 'preset'} tokens, "
        f"{len(report['runs'])} runs"
    )
    return summary, rows


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    statuses = dict(arg.split("=", 1) for arg in argv[1:])
    details: list[str] = []
    print("\n| part | status | result |\n| --- | --- | --- |")
    for part, status in statuses.items():
        if part in ("nccl", "kill"):
            result = pytest_result(out, part)
        else:
            result, table = pool_result(out) if part == "pool" else atscale_result(out)
            if table:
                details += ["", f"{part}: {result}", *table]
        print(f"| {part} | {status} | {result} |")
    for line in details:
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
