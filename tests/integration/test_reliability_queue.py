"""Reliability scenarios of docs/reliability.md that had no regression test, with the fake
backend: repeated kill -9 of workers, a frozen (SIGSTOP) worker, and Redis losing its last
writes. Each runs the table's own scenario (benchmarks/chaos) at a smaller size against private
redis-servers and real `radixq` processes; the oracle is the list of ids the scenario gave.

Every row must meet the table's targets (Row.misses): no id without a row after the
documented recovery, no id written twice, no dead letter, every loss of Redis's reported,
no process and no private Redis folder left behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.chaos.lab import Lab
from benchmarks.chaos.row import Row
from benchmarks.chaos.scenarios import BY_NAME
from tests.conftest import require_redis_server

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _needs_redis_server() -> None:
    require_redis_server()


def run(name: str, tmp_path: Path, **sizes: object) -> tuple[Row, Lab]:
    with Lab(name, tmp_path / name) as lab:
        row = BY_NAME[name](lab, **sizes)
    assert row.misses() == [], lab.tails()
    return row, lab


def test_workers_killed_again_and_again_lose_nothing_and_write_each_id_once(tmp_path: Path) -> None:
    # 3 workers x 8 jobs at a time x 200 ms: the run outlasts 4 kills, then the rest finish
    row, lab = run("kill9-chaos", tmp_path, jobs=600, latency_s=0.2, max_kills=4)
    # kill -9 struck workers that held jobs, several times: the property was exercised
    assert lab.facts["kills"] == 4 and lab.facts["held"] >= 4, lab.notes
    assert row.lost == [] and row.duplicates == []
    # dead letters: exactly the jobs that max_attempts (3) killed workers held (Row.misses)
    assert sorted(row.dead_lettered) == row.observed.culprits


def test_a_frozen_worker_loses_its_jobs_to_the_others_and_nothing_is_written_twice(tmp_path: Path) -> None:
    row, lab = run("zombie-worker", tmp_path, jobs=600)
    assert lab.facts["taken_over"] > 0  # its jobs were run by others while it was stopped
    assert row.duplicates == [] and row.lost == []


def test_redis_kill_9_with_appendfsync_everysec_loses_nothing_or_says_so(tmp_path: Path) -> None:
    row, _ = run("redis-kill9-aof-everysec", tmp_path, jobs=400)
    seen = row.observed
    assert seen.missing_before == 0 or seen.detected, "a loss nobody reported"
    assert row.lost == [] and row.duplicates == []


def test_redis_losing_its_last_second_is_reported_and_recovered_exactly_once(tmp_path: Path) -> None:
    row, lab = run("redis-aof-last-second-lost", tmp_path, jobs=600, later=200)
    seen = row.observed
    assert seen.missing_before  # jobs of the second file were gone before they had a row
    assert any("Redis lost part of this queue" in said for said in seen.detected), seen.detected
    assert "Traceback" not in lab.log("collect")
    assert row.lost == [] and row.duplicates == []  # after enqueueing both files again
