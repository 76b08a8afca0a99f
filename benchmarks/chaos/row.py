"""What one reliability scenario is measured into: a Row of the table in docs/reliability.md.

``run_scenario`` runs a scenario in a Lab, shuts everything down (Lab.settle) and reads the
output file: ids lost, written twice, dead-lettered, failed, the time, and what was left
behind. The oracle for "lost" is the list of job ids the scenario gave (its input), never what
Redis or collect report.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos.lab import Lab


@dataclass
class Observed:
    """What a scenario hands back: its output file and what the right answer is."""

    output: Path
    ids: list[str]  # every job id the scenario gave, in order
    culprits: list[str] = field(default_factory=list)  # the only ids that may be dead-lettered
    expected_errors: dict[str, str] = field(default_factory=dict)  # id -> error code that is right
    missing_before: int | None = None  # Redis lost writes: ids with no row before the recovery
    detected: list[str] = field(default_factory=list)  # how that loss was reported


@dataclass
class Row:
    scenario: str
    jobs: int
    lost: list[str]
    duplicates: list[str]
    dead_lettered: list[str]
    error_rows: dict[str, str]  # rows with an error other than dead_letter: id -> code
    wall_s: float
    left_behind: list[str]  # "pid command" of processes still running after the scenario
    temp_left: list[str]
    observed: Observed
    problems: list[str]  # expectations the scenario checked on the way that failed
    notes: list[str]

    def misses(self) -> list[str]:
        """Every target this row misses (empty: all met)."""
        seen = self.observed
        missed = [f"{len(self.lost)} ids lost: {self.lost[:5]}"] if self.lost else []
        if self.duplicates:
            missed.append(f"ids written twice: {self.duplicates[:5]}")
        if sorted(self.dead_lettered) != sorted(seen.culprits):
            missed.append(f"dead-lettered {sorted(self.dead_lettered)[:5]}, expected {sorted(seen.culprits)}")
        if self.error_rows != seen.expected_errors:
            missed.append(f"error rows {self.error_rows}, expected {seen.expected_errors}")
        if seen.missing_before and not seen.detected:
            missed.append(f"{seen.missing_before} ids lost by Redis and nobody said so")
        if self.left_behind:
            missed.append(f"left running: {self.left_behind}")
        if self.temp_left:
            missed.append(f"folders left: {self.temp_left}")
        return missed + self.problems

    def markdown(self) -> str:
        seen = self.observed
        before = "n/a" if seen.missing_before is None else str(seen.missing_before)
        if seen.detected:
            before += f" ({'; '.join(seen.detected)})"
        dead = f"{len(self.dead_lettered)}" + (
            f" ({', '.join(sorted(self.dead_lettered))})" if self.dead_lettered else ""
        )
        errors = ", ".join(f"{i}: {code}" for i, code in sorted(self.error_rows.items())) or "0"
        cells = [
            f"`{self.scenario}`",
            str(self.jobs),
            str(len(self.lost)),
            before,
            str(len(self.duplicates)),
            dead,
            errors,
            f"{self.wall_s:.1f} s",
            str(len(self.left_behind)),
            str(len(self.temp_left)),
            "; ".join(self.notes + [f"MISSED: {m}" for m in self.misses()]),
        ]
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


MARKDOWN_HEADER = (
    "| scenario | jobs | lost | lost before recovery (detected by) | duplicated | dead-lettered | "
    "other error rows | time | processes left | folders left | notes |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def row_id(row: dict[str, Any]) -> str:
    return row.get("custom_id") or row["id"]


def run_scenario(name: str, lab: Lab, scenario: Callable[..., Observed], **params: Any) -> Row:
    """Run ``scenario(lab, **params)``, shut everything down and measure the row."""
    started = time.monotonic()
    observed = scenario(lab, **params)
    left, folders = lab.settle()
    wall_s = time.monotonic() - started
    rows = read_rows(observed.output)
    counts = Counter(row_id(row) for row in rows)
    errors = {row_id(row): row["error"]["code"] for row in rows if row.get("error")}
    wanted = [*observed.ids, *observed.expected_errors]
    unexpected = sorted(set(counts) - set(wanted))
    if unexpected:
        lab.problems.append(f"rows for ids never given: {unexpected[:5]}")
    return Row(
        scenario=name,
        jobs=len(wanted),
        lost=[i for i in wanted if i not in counts],
        duplicates=sorted(i for i, n in counts.items() if n > 1),
        dead_lettered=sorted(i for i, code in errors.items() if code == "dead_letter"),
        error_rows={i: code for i, code in errors.items() if code != "dead_letter"},
        wall_s=wall_s,
        left_behind=left,
        temp_left=folders,
        observed=observed,
        problems=lab.problems,
        notes=lab.notes,
    )
