"""The measured reliability table: each scenario of benchmarks/chaos against private redis-servers
and real `radixq` processes, one row each (docs/reliability.md).

    python benchmarks/reliability.py --list
    python benchmarks/reliability.py                       # every scenario
    python benchmarks/reliability.py zombie-worker poison-run --markdown
    python benchmarks/reliability.py --json rows.json      # the rows, for the record

A row: jobs given; ids with no row in the output after the documented recovery (lost); where
Redis itself lost writes, ids with no row before that recovery and who said so; ids written
twice; ids dead-lettered (only the culprits may be); other error rows; the wall time of the
whole scenario; processes still running after it and private Redis folders left on disk.
Exit 0 when every row meets its targets, 1 otherwise (the misses are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.chaos.engine_faults import save_tiny_model  # noqa: E402
from benchmarks.chaos.lab import Lab  # noqa: E402
from benchmarks.chaos.row import MARKDOWN_HEADER, Row  # noqa: E402
from benchmarks.chaos.scenarios import BY_NAME, SCENARIOS  # noqa: E402


def describe(row: Row) -> str:
    seen = row.observed
    parts = [
        f"{row.scenario}: {row.jobs} jobs, {len(row.lost)} lost",
        f"{len(row.duplicates)} duplicated",
        f"{len(row.dead_lettered)} dead-lettered {row.dead_lettered or ''}".rstrip(),
        f"error rows {row.error_rows or 0}",
        f"{row.wall_s:.1f} s",
        f"{len(row.left_behind)} processes and {len(row.temp_left)} folders left",
    ]
    if seen.missing_before is not None:
        said = f" ({'; '.join(seen.detected)})" if seen.detected else ""
        parts.insert(2, f"{seen.missing_before} missing before recovery{said}")
    lines = [", ".join(parts)] + [f"    note: {note}" for note in row.notes]
    return "\n".join(lines + [f"    MISSED: {miss}" for miss in row.misses()])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="SCENARIO", help="default: all")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--markdown", action="store_true", help="print the rows as a markdown table")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's folder (logs, output)")
    args = parser.parse_args()
    if args.list:
        for scenario in SCENARIOS:
            print(f"{scenario.name:28} {scenario.what}")
        return 0
    unknown = [name for name in args.names if name not in BY_NAME]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; see --list")
    chosen = [BY_NAME[name] for name in args.names] or SCENARIOS
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="radixq-reliability-") as scratch:
        model_dir = save_tiny_model(Path(scratch) / "tiny-llama") if any(s.engine for s in chosen) else None
        for scenario in chosen:
            root = Path(scratch) / scenario.name if args.keep else None
            with Lab(scenario.name, root) as lab:
                lab.notes.append(f"load average {os.getloadavg()[0]:.1f} at the start")
                try:
                    row = scenario(lab, model_dir)
                except Exception as exc:  # a scenario that could not finish is a row that says so
                    print(f"{scenario.name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                    print(f"    folder: {lab.dir}", flush=True)
                    continue
            rows.append(row)
            print(describe(row), flush=True)
        if args.keep:
            keep = Path(tempfile.mkdtemp(prefix="radixq-reliability-kept-"))
            for scenario in chosen:
                if (Path(scratch) / scenario.name).exists():
                    (Path(scratch) / scenario.name).rename(keep / scenario.name)
            print(f"logs and outputs kept in {keep}")
    if args.markdown:
        print(f"\nmeasured {time.strftime('%Y-%m-%d')}\n\n{MARKDOWN_HEADER}")
        for row in rows:
            print(row.markdown())
    if args.json:
        args.json.write_text(json.dumps([row_record(row) for row in rows], indent=2))
    failed = len(chosen) - len(rows)
    return 0 if not failed and not any(row.misses() for row in rows) else 1


def row_record(row: Row) -> dict[str, object]:
    seen = row.observed
    return {
        "scenario": row.scenario,
        "jobs": row.jobs,
        "lost": row.lost,
        "missing_before_recovery": seen.missing_before,
        "detected_by": seen.detected,
        "duplicates": row.duplicates,
        "dead_lettered": row.dead_lettered,
        "error_rows": row.error_rows,
        "wall_s": round(row.wall_s, 1),
        "left_behind": row.left_behind,
        "folders_left": row.temp_left,
        "notes": row.notes,
        "misses": row.misses(),
    }


if __name__ == "__main__":
    sys.exit(main())
