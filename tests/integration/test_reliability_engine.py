"""Reliability scenarios of docs/reliability.md that had no regression test, with the real
engine (a tiny random Llama on CPU): a job that crashes the engine under `radixq run`, and
the bad stream entries of issue 8 under `radixq worker`. Each runs the table's own scenario
(benchmarks/chaos); completions are checked against transformers' greedy tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos.engine_faults import BAD_ID_SHOWN, save_tiny_model
from benchmarks.chaos.lab import Lab
from benchmarks.chaos.row import read_rows
from benchmarks.chaos.scenarios import BY_NAME
from tests.conftest import require_redis_server
from tests.model_fixtures import hf_from_dir, hf_greedy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("reliability-llama"))


def innocent_rows_match_transformers(model_dir: Path, source: Path, out: Path) -> int:
    """Every job of the input except the poison has a row without error whose tokens are
    transformers' greedy ones; returns how many."""
    rows = {row["id"]: row for row in read_rows(out)}
    checked = 0
    for line in source.read_text().splitlines():
        job = json.loads(line)
        if job["id"] == "poison":
            continue
        row = rows[job["id"]]
        assert row["error"] is None, row
        assert row["choices"][0]["token_ids"] == hf_greedy(
            hf_from_dir(model_dir), job["input_ids"], job["max_tokens"]
        )
        checked += 1
    return checked


def test_poison_job_under_run_is_dead_lettered_within_the_run(model_dir: Path, tmp_path: Path) -> None:
    with Lab("poison-run", tmp_path / "lab") as lab:
        row = BY_NAME["poison-run"](lab, model_dir, jobs=6, max_attempts=1)
    # exit code 1 and "1 jobs failed" are checked by the scenario (Row.problems)
    assert row.misses() == [], lab.tails()
    assert row.dead_lettered == ["poison"] and row.lost == [] and row.duplicates == []
    assert row.left_behind == [] and row.temp_left == []
    poison = next(r for r in read_rows(row.observed.output) if r["id"] == "poison")
    assert "crashed the engine 1 times when it ran alone (max_attempts=1)" in poison["error"]["message"]
    assert innocent_rows_match_transformers(model_dir, lab.dir / "in.jsonl", row.observed.output) == 6


def test_bad_stream_entries_get_their_own_error_rows_and_the_rest_completes(
    model_dir: Path, tmp_path: Path
) -> None:
    require_redis_server()
    with Lab("bad-stream-entries", tmp_path / "lab") as lab:
        row = BY_NAME["bad-stream-entries"](lab, model_dir, jobs=4)
    assert row.misses() == [], lab.tails()
    assert row.error_rows == {BAD_ID_SHOWN: "invalid_job", "deep": "invalid_job", "POISON": "invalid_job"}
    assert row.dead_lettered == [] and row.lost == [] and row.duplicates == []
    messages = {r["id"]: r["error"]["message"] for r in read_rows(row.observed.output) if r["error"]}
    assert "is not UTF-8" in messages[BAD_ID_SHOWN]
    assert "nested" in messages["deep"]
    assert "top_k=9223372036854775808" in messages["POISON"]
    assert "Traceback" not in lab.log("e0")  # each entry was answered, none crashed the worker
    for i in range(4):
        row_j = next(r for r in read_rows(row.observed.output) if r["id"] == f"j{i:02d}")
        assert row_j["choices"][0]["token_ids"] == hf_greedy(hf_from_dir(model_dir), [5 + i, 6, 7], 6)
