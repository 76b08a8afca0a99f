"""The pipeline API against a real redis-server and a `radixq worker` with the fake generator:
results as they complete, idempotent resubmission (deterministic ids), pandas in and out, a
Hugging Face ``Dataset.map`` batch function (plain dict batches; a real Dataset if installed).

The fake generator's text is a function of the job id (tests/fake_generator.py), so every
expected text is recomputed here.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from producer.client import ContentChanged
from producer.datasets import ColumnMapping
from producer.pipeline import Pipeline, ResultsGone
from tests.fake_generator import fake_text
from tests.integration.procs import radixq, start_worker
from tests.waiting import LIVENESS_S
from wire.schema import Job

pytestmark = pytest.mark.integration


@pytest.fixture
def worker(redis_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = start_worker(redis_url, "w1", tmp_path / "w1.log", RADIXQ_FAKE_LATENCY_S="0.05")
    yield proc
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=LIVENESS_S) == 0


def test_results_as_they_complete_and_resubmission_enqueues_nothing(
    redis_url: str, worker: subprocess.Popen[bytes]
) -> None:
    rows = [{"question": f"q{i}", "num": i} for i in range(20)] + [{"question": None, "num": 99}]
    mapping = ColumnMapping(template="Q: {question} ({num})\nA:")
    with Pipeline(redis_url) as pipe:
        batch = pipe.submit(rows, mapping)
        assert (batch.enqueued, batch.skipped, batch.rejected, len(batch.ids)) == (20, 0, 1, 21)
        seen = [result.id for result in batch.as_completed(timeout_s=60)]
        assert sorted(seen) == sorted(batch.ids)  # each once
        # The same rows again (a rerun after a crash): same ids, nothing new, results found.
        again = pipe.submit(rows, mapping)
        assert again.ids == batch.ids and (again.enqueued, again.skipped) == (0, 20)
        results = again.results(timeout_s=10)
    assert [r.id for r in results] == batch.ids
    for result in results[:20]:
        assert result.error is None and result.choices[0].text == fake_text(result.id)
    assert results[20].error is not None and results[20].error.code == "invalid_job"
    assert "question" in results[20].error.message


def test_pandas_dataframe_in_result_columns_out(redis_url: str, worker: subprocess.Popen[bytes]) -> None:
    frame = pd.DataFrame({"qid": [10, 11, 12], "question": ["a?", "b?", "c?"], "text": ["x", "y", "z"]})
    with Pipeline(redis_url) as pipe:
        out = pipe.generate_dataframe(
            frame, ColumnMapping(id_column="qid", prompt_column="question"), timeout_s=60
        )
    assert list(out["qid"]) == [10, 11, 12] and list(out["text"]) == ["x", "y", "z"]  # input kept
    assert list(out["id"]) == ["10", "11", "12"]
    assert list(out["result_text"]) == [fake_text(str(i)) for i in (10, 11, 12)]
    assert list(out["error"]) == [None, None, None] and "text" not in frame.columns.difference(["text"])


def test_batch_function_for_dataset_map(redis_url: str, worker: subprocess.Popen[bytes]) -> None:
    with Pipeline(redis_url) as pipe:
        generate = pipe.batch_function(ColumnMapping(prompt_column="question"), timeout_s=60)
        first = generate({"question": ["one", "two"]}, [0, 1])
        second = generate({"question": ["three"]}, [2])
        # Rerun of the first batch (same positions): the same ids, results already there.
        rerun = generate({"question": ["one", "two"]}, [0, 1])
    assert rerun == first and len(set(first["id"]) | set(second["id"])) == 3
    assert first["text"] == [fake_text(i) for i in first["id"]]


def test_hugging_face_dataset_map(redis_url: str, worker: subprocess.Popen[bytes]) -> None:
    import datasets

    ds = datasets.Dataset.from_dict({"question": ["one", "two", "three", "four"]})
    with Pipeline(redis_url) as pipe:
        generate = pipe.batch_function(ColumnMapping(prompt_column="question"), timeout_s=60)
        mapped = ds.map(generate, batched=True, batch_size=3, with_indices=True)
        again = ds.map(generate, batched=True, batch_size=2, with_indices=True, load_from_cache_file=False)
    assert mapped["question"] == ds["question"] and len(set(mapped["id"])) == 4
    assert mapped["text"] == [fake_text(i) for i in mapped["id"]]
    assert again["id"] == mapped["id"]  # ids from positions, not from how the map batched them


def test_results_trimmed_by_a_collect_are_reported(
    redis_url: str, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    with Pipeline(redis_url) as pipe:
        batch = pipe.submit([Job(id="t1", prompt="x"), Job(id="t2", prompt="y")])
        batch.results(timeout_s=60)
        collected = radixq("collect", "-o", str(tmp_path / "o.jsonl"), "--redis-url", redis_url)
        assert collected.returncode == 0, collected.stderr
        with pytest.raises(ResultsGone, match="2 results were trimmed"):
            list(batch.as_completed(timeout_s=5))


def test_a_row_resubmitted_with_other_content_is_refused_or_run_again(
    redis_url: str, worker: subprocess.Popen[bytes]
) -> None:
    """Issue 17, item 3: under an id column, a changed question is not answered with the old
    result: submit raises ContentChanged naming it, and rerun_changed runs it again (the fake
    generator counts the prompt's words as its prompt tokens)."""
    mapping = ColumnMapping(id_column="qid", prompt_column="question")
    with Pipeline(redis_url) as pipe:
        first = pipe.submit([{"qid": 1, "question": "one"}, {"qid": 2, "question": "two"}], mapping).results(
            60
        )
        edited = [{"qid": 1, "question": "one, and more words"}, {"qid": 2, "question": "two"}]
        with pytest.raises(ContentChanged) as caught:
            pipe.submit(edited, mapping)
        assert caught.value.ids == ["1"]
        batch = pipe.submit(edited, mapping, rerun_changed=True)
        assert (batch.rerun, batch.skipped) == (1, 1)
        results = batch.results(timeout_s=60)
    assert [r.usage.prompt_tokens for r in first] == [1, 1]
    assert [r.usage.prompt_tokens for r in results] == [4, 1]


def test_a_cancelled_batch_still_yields_every_row_once(redis_url: str) -> None:
    """No worker runs: Batch.cancel() gives each row without a result its ``cancelled`` result
    (the rejected row keeps its invalid_job one), so as_completed ends."""
    rows = [{"question": f"q{i}"} for i in range(5)] + [{"question": None}]
    with Pipeline(redis_url, queue="cancelled") as pipe:
        batch = pipe.submit(rows, ColumnMapping(prompt_column="question"))
        report = batch.cancel()
        assert (report.scope, report.cancelled) == (6, 5)
        codes = {r.id: r.error.code for r in batch.as_completed(timeout_s=LIVENESS_S) if r.error}
        assert sorted(codes) == sorted(batch.ids)
        assert sorted(codes.values()) == ["cancelled"] * 5 + ["invalid_job"]
