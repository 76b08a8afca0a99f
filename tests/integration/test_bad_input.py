"""Malformed input: each bad line is reported with its line number and reason, nothing else
is lost, and a job that is invalid only at intake gets an error result at once."""

from __future__ import annotations

import gzip
import json
import signal
from pathlib import Path

import pytest
import redis

from tests.fake_generator import fake_text
from tests.integration.procs import radixq, start_worker
from tests.jobs_stream import job_entries, pending_count
from tests.waiting import LIVENESS_S, wait_until
from wire.keys import FIELD_ID, FIELD_JOB, QueueKeys
from wire.schema import MAX_JOB_BYTES

pytestmark = pytest.mark.integration

# (line, the words the reason must contain); line numbers are 1-based positions in the file.
BAD_LINES = [
    ('{"id": "b1", "prompt": "unterminated', "not valid JSON"),
    ('["a", "list"]', "must be a JSON object"),
    ('{"id": "b3", "prompt": "x", "max_tokens": "ten"}', "max_tokens"),
    ('{"id": "b4", "prompt": "x", "temperature": -0.5}', "temperature"),
    ('{"id": "b5", "prompt": "x", "top_p": 1.5}', "top_p"),
    ('{"id": "b6", "max_tokens": 5}', "exactly one of prompt, messages, input_ids"),
    ('{"id": "b7", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "exactly one of"),
    ('{"id": "b8", "prompt": "' + "x" * (MAX_JOB_BYTES + 10) + '"}', "exceeds the limit"),
    ('{"id": "b9", "prompt": "x", "temprature": 0.5}', "unknown field"),
    ('{"id": "b10", "messages": []}', "at least one message"),
    ('{"id": "b11", "input_ids": [5, -1, 7]}', "input_ids[1]=-1: token ids must be integers in [0, 2**31)"),
    ('{"id": "b12", "prompt": "x", "n": 0}', "n=0"),
    ('{"id": 12, "prompt": "x"}', "id"),
    ('{"id": "b14", "prompt": "x", "max_tokens": 0}', "max_tokens"),
    ('{"id": "b15", "messages": [{"role": "user"}]}', "content"),
    ('{"custom_id": "b16", "method": "POST", "url": "/v1/embeddings", "body": {}}', "url"),
    # issue 8: numbers past msgpack's range, deep nesting and bad bytes are one line's rejection
    ('{"id":"POISON","prompt":"Hi","max_tokens":4,"top_k":9223372036854775808}', "top_k=9223372036854775808"),
    ('{"id": "b18", "prompt": "x", "top_k": 18446744073709551616}', "top_k=18446744073709551616"),
    ('{"id": "b19", "prompt": "x", "stop_token_ids": [18446744073709551616]}', "stop_token_ids[0]="),
    ('{"id": "b20", "input_ids": [1, 18446744073709551616]}', "input_ids[1]=18446744073709551616"),
    ('{"id": "b21", "prompt": "x", "metadata": {"n": 18446744073709551616}}', "metadata.n="),
    (
        '{"id": "b22", "prompt": "x", "metadata": ' + '{"a": ' * 985 + "1" + "}" * 985 + "}",
        "metadata: nested",
    ),
    ('{"id": "b23", "prompt": "x", "metadata": ' + "[" * 5000 + "]" * 5000 + "}", "metadata: nested"),
    ('{"id": "b24", "prompt": "caf\udce9"}', "encoding: not valid UTF-8: byte 29 is 0xe9"),
    ('{"id": "b25", "prompt": "x", "temperature": 1e-45, "top_p": 1e-300}', "top_p=1e-300"),
]


def write_mixed_file(path: Path) -> tuple[list[str], dict[int, str]]:
    """Valid and bad lines interleaved; returns the valid ids and {line_no: expected words}."""
    lines: list[str] = []
    valid_ids: list[str] = []
    expected_bad: dict[int, str] = {}
    for i, (bad, words) in enumerate(BAD_LINES):
        job_id = f"ok-{i}"
        lines.append(json.dumps({"id": job_id, "prompt": f"valid prompt {i}", "max_tokens": 4}))
        valid_ids.append(job_id)
        lines.append(bad)
        expected_bad[len(lines)] = words
    lines.append(json.dumps({"messages": [{"role": "user", "content": "no id here"}], "temperature": 0}))
    lines.append(json.dumps({"input_ids": [1, 2, 3], "seed": 4, "stop_token_ids": [2]}))
    path.write_text("\n".join(lines) + "\n", errors="surrogateescape")  # \udcXX: the byte XX
    return valid_ids, expected_bad


def test_bad_lines_reported_and_valid_jobs_complete(redis_url: str, tmp_path: Path) -> None:
    source = tmp_path / "mixed.jsonl"
    valid_ids, expected_bad = write_mixed_file(source)
    enqueue = radixq("enqueue", str(source), "--redis-url", redis_url)
    assert enqueue.returncode == 1, enqueue.stderr  # exit 1: some lines rejected, the valid ones enqueued
    num_valid = len(valid_ids) + 2
    assert f"enqueued {num_valid}, skipped 0 (already enqueued), rejected {len(BAD_LINES)}" in enqueue.stdout
    reported = {}
    for line in enqueue.stderr.splitlines():
        assert line.startswith(f"rejected {source}:line ")
        line_no, _, reason = line.removeprefix(f"rejected {source}:line ").partition(": ")
        reported[int(line_no)] = reason
    assert sorted(reported) == sorted(expected_bad)
    for line_no, words in expected_bad.items():
        assert words in reported[line_no], (line_no, reported[line_no])

    again = radixq("enqueue", str(source), "--redis-url", redis_url)
    assert f"enqueued 0, skipped {num_valid} (already enqueued)" in again.stdout

    worker = start_worker(redis_url, "w1", tmp_path / "w1.log")
    try:
        out = tmp_path / "out.jsonl"
        collected = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--timeout", "60")
        # exit 1: the rejected lines are error rows
        assert collected.returncode == 1, collected.stderr
        assert f"{len(BAD_LINES)} jobs failed" in collected.stderr
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # One row per input line, in input order; each rejected line is its invalid_job row.
    assert len(rows) == num_valid + len(BAD_LINES)
    for line_no, row in enumerate(rows, start=1):
        if line_no in expected_bad:
            assert row["error"]["code"] == "invalid_job", (line_no, row)
            assert row["error"]["message"].startswith(f"line {line_no}: "), row
            assert expected_bad[line_no] in row["error"]["message"], (line_no, row)
        else:
            assert row["error"] is None and row["choices"][0]["text"] == fake_text(row["id"]), row
    assert [row["id"] for row in rows if row["error"] is None][: len(valid_ids)] == valid_ids


def test_gzip_file_with_a_byte_order_mark_enqueues(redis_url: str, tmp_path: Path) -> None:
    """Regression (issue 8, point 3): a BOM rejected line 1 and `.jsonl.gz` was refused."""
    source = tmp_path / "in.jsonl.gz"
    lines = ['{"id": "g1", "prompt": "x"}', '{"id": "g2", "input_ids": [1, 2]}']
    source.write_bytes(gzip.compress(("\ufeff" + "\n".join(lines) + "\n").encode()))
    enqueue = radixq("enqueue", str(source), "--redis-url", redis_url)
    assert enqueue.returncode == 0, enqueue.stderr
    assert "enqueued 2, skipped 0 (already enqueued), rejected 0" in enqueue.stdout
    keys = QueueKeys()
    client = redis.Redis.from_url(redis_url)
    ids = sorted(fields[FIELD_ID.encode()] for _, fields in job_entries(client, keys))
    client.close()
    assert ids == [b"g1", b"g2"]


def test_job_invalid_at_intake_gets_error_result_without_retries(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = QueueKeys()
    client.xgroup_create(keys.jobs, keys.group, id="0", mkstream=True)
    bad_entry = client.xadd(keys.jobs, {FIELD_ID: "raw-1", FIELD_JOB: b"\xc1not msgpack"}).decode()
    wrong_entry = client.xadd(keys.jobs, {FIELD_ID: "raw-2", FIELD_JOB: b"\x81\xa2id\xa5raw-2"}).decode()
    worker = start_worker(redis_url, "w1", tmp_path / "w1.log", "--max-attempts", "5")
    try:
        wait_until(lambda: client.hlen(keys.done) >= 2, "both entries done", tmp_path / "w1.log", poll_s=0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    assert client.hgetall(keys.done) == {b"raw-1": bad_entry.encode(), b"raw-2": wrong_entry.encode()}
    assert client.hgetall(keys.failed) == {b"raw-1": b"invalid_job", b"raw-2": b"invalid_job"}
    out = tmp_path / "out.jsonl"
    collected = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--no-wait", "--keep-results")
    assert collected.returncode == 1, collected.stderr  # exit 1: error rows written
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["raw-1"]["error"]["code"] == "invalid_job"
    assert "not a msgpack job" in rows["raw-1"]["error"]["message"]
    assert rows["raw-2"]["error"]["code"] == "invalid_job"
    assert "exactly one of prompt, messages, input_ids" in rows["raw-2"]["error"]["message"]
    # One delivery each, acked at once: no retries, nothing pending, nothing dead-lettered.
    assert pending_count(client, keys) == 0
    assert client.xlen(keys.results) == 2
    assert client.xlen(keys.dead) == 0
    client.close()
