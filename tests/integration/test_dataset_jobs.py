"""Dataset jobs end to end: one output row per input row (rejected rows as invalid_job rows, or
in the --errors file), Parquet in and out, joined to the input, for enqueue+collect and run.

The worker is the fake generator, whose completion text is a function of the job id
(tests/fake_generator.py), so the expected text of every row is recomputed here.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_generator import fake_text
from tests.integration.procs import FAKE_GENERATOR, radixq, start_worker
from tests.waiting import LIVENESS_S
from wire import exits

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def openai_line(custom_id: str, **body: object) -> str:
    body = {"messages": [{"role": "user", "content": f"hi {custom_id}"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body})


def openai_file(path: Path) -> list[str]:
    """Three good requests around two rejected ones; returns the custom_ids in file order."""
    lines = [
        openai_line("r1"),
        openai_line("r2", max_tokens=-1),
        openai_line("r3"),
        openai_line("r4", temperature="hot"),
        openai_line("r5"),
    ]
    path.write_text("\n".join(lines) + "\n")
    return ["r1", "r2", "r3", "r4", "r5"]


def test_openai_file_enqueue_collect_rows_in_place_or_in_the_errors_file(
    redis_url: str, tmp_path: Path
) -> None:
    source = tmp_path / "batch.jsonl"
    ids = openai_file(source)
    enqueue = radixq("enqueue", str(source), "--redis-url", redis_url, "--queue", "inplace")
    assert enqueue.returncode == exits.JOBS_FAILED, enqueue.stderr
    assert "enqueued 3, skipped 0 (already enqueued), rejected 2" in enqueue.stdout
    errors = tmp_path / "errors.jsonl"
    separate = radixq(
        "enqueue", str(source), "--redis-url", redis_url, "--queue", "apart", "--errors", str(errors)
    )
    assert separate.returncode == exits.JOBS_FAILED, separate.stderr
    again = radixq("enqueue", str(source), "--redis-url", redis_url, "--queue", "inplace")
    assert "enqueued 0, skipped 3 (already enqueued), rejected 2" in again.stdout  # idempotent
    worker = start_worker(redis_url, "w1", tmp_path / "w1.log", "--queue", "inplace")
    other = start_worker(redis_url, "w2", tmp_path / "w2.log", "--queue", "apart")
    try:
        out = tmp_path / "out.jsonl"
        collected = radixq(
            "collect", "-o", str(out), "--redis-url", redis_url, "--queue", "inplace", "--timeout", "60"
        )
        apart = tmp_path / "apart.jsonl"
        collected_apart = radixq(
            "collect", "-o", str(apart), "--redis-url", redis_url, "--queue", "apart", "--timeout", "60"
        )
    finally:
        for proc in (worker, other):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=LIVENESS_S) == 0
    assert collected.returncode == exits.JOBS_FAILED and "2 jobs failed" in collected.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["custom_id"] for row in rows] == ids  # 5 lines in, 5 lines out, in order
    for row in rows:
        if row["custom_id"] in ("r2", "r4"):
            assert row["response"] is None and row["error"]["code"] == "invalid_job", row
        else:
            assert row["error"] is None
            assert row["response"]["body"]["choices"][0]["message"]["content"] == fake_text(row["custom_id"])
    # With --errors: the output holds the jobs that ran, the errors file the rejected lines.
    assert collected_apart.returncode == exits.OK, collected_apart.stderr
    assert [json.loads(line)["custom_id"] for line in apart.read_text().splitlines()] == ["r1", "r3", "r5"]
    rejected = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(r["custom_id"], r["response"], r["error"]["code"]) for r in rejected] == [
        ("r2", None, "invalid_job"),
        ("r4", None, "invalid_job"),
    ]


def dataset(path: Path) -> list[dict]:  # type: ignore[type-arg]
    records = [
        {"key": f"k{i}", "question": f"question {i}" if i != 2 else None, "level": i % 3} for i in range(6)
    ]
    pq.write_table(pa.Table.from_pylist(records), path)
    return records


def check_joined(out: Path, records: list[dict]) -> None:  # type: ignore[type-arg]
    table = pq.read_table(out).to_pylist()
    assert [row["key"] for row in table] == [r["key"] for r in records]  # one row per input row
    for row, record in zip(table, records, strict=True):
        assert (row["question"], row["level"]) == (record["question"], record["level"])
        if record["question"] is None:
            assert (row["error"], row["text"]) == ("invalid_job", None)
        else:
            assert (row["error"], row["text"]) == (None, fake_text(record["key"]))


def test_parquet_enqueue_collect_joined(redis_url: str, tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    records = dataset(source)
    mapping = ["--id-column", "key", "--template", "Q: {question}\nA:"]
    enqueue = radixq("enqueue", str(source), "--redis-url", redis_url, *mapping)
    assert enqueue.returncode == exits.JOBS_FAILED and "rejected 1" in enqueue.stdout
    assert f"rejected {source}:row 3: " in enqueue.stderr
    worker = start_worker(redis_url, "w1", tmp_path / "w1.log")
    out = tmp_path / "out.parquet"
    try:
        collected = radixq(
            "collect",
            "-o",
            str(out),
            "--redis-url",
            redis_url,
            "--timeout",
            "60",
            "--join-input",
            str(source),
            *mapping,
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    assert collected.returncode == exits.JOBS_FAILED, collected.stderr
    check_joined(out, records)
    refused = radixq(
        "collect", "-o", str(tmp_path / "o.jsonl"), "--redis-url", redis_url, "--join-input", str(source)
    )
    assert refused.returncode == exits.USAGE and "needs a Parquet output" in refused.stderr


def test_run_parquet_in_parquet_out_and_resume(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    records = dataset(source)
    out = tmp_path / "out.parquet"
    args = ["run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", "60"]
    mapping = ["--id-column", "key", "--prompt-column", "question", "--join-input"]
    done = radixq(*args, *mapping)
    assert done.returncode == exits.JOBS_FAILED, done.stderr  # the rejected row
    check_joined(out, records)
    again = radixq(*args, *mapping)
    assert again.returncode == exits.JOBS_FAILED and "resuming: 6 jobs already" in again.stderr
    check_joined(out, records)
    unreadable = tmp_path / "bad.parquet"
    unreadable.write_text("not parquet")
    bad = radixq("run", str(unreadable), "-o", str(out), "--generator", FAKE_GENERATOR)
    assert bad.returncode == exits.USAGE and "Traceback" not in bad.stderr and "cannot read" in bad.stderr


def test_run_errors_file_takes_run_time_errors_too_and_resumes(tmp_path: Path) -> None:
    """Issue 17, item 8: with --errors ERRFILE, OUT holds the jobs that succeeded and ERRFILE
    every failure, rejected before running or failed while running, each in input order (as
    OpenAI's Batch API splits output and error files). A second run runs nothing again."""
    source = tmp_path / "batch.jsonl"
    lines = [
        openai_line("r1"),
        openai_line("r2", max_tokens=-1),  # rejected
        openai_line("r3", metadata={"fake_error": "internal"}),  # fails on the worker
        openai_line("r4"),
        openai_line("r5", metadata={"fake_error": "prompt_too_long"}),
    ]
    source.write_text("\n".join(lines) + "\n")
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    args = ["run", str(source), "-o", str(out), "--errors", str(errors), "--generator", FAKE_GENERATOR]
    for attempt in range(2):
        done = radixq(*args, "--timeout", "60")
        assert done.returncode == exits.JOBS_FAILED, done.stderr
        assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["r1", "r4"]
        failed = [json.loads(line) for line in errors.read_text().splitlines()]
        assert [(row["custom_id"], row["error"]["code"]) for row in failed] == [
            ("r2", "invalid_job"),
            ("r3", "internal"),
            ("r5", "prompt_too_long"),
        ]
        assert "2 jobs failed" in done.stderr and "1 row of" in done.stderr and "was rejected" in done.stderr
        # Issue 32, item 1: each file's own count, and the failures named where they are.
        assert f"2 jobs failed (error lines in {errors})" in done.stderr
        if attempt:
            assert f"wrote 0 results to {out} and 0 to {errors}" in done.stderr  # every row was in one of them
        else:
            assert f"wrote 2 results to {out} and 2 to {errors} (0 were already there)" in done.stderr
