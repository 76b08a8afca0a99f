"""The edges a real deployment hits at the command line (issue 21): every error one `error:`
line with the exit code docs/guide.md gives, a bad row that row's `invalid_job` row, and an enqueue that
streams. CLI subprocesses against a private redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from tests.integration.procs import REPO_ROOT, radixq, subprocess_env
from tests.waiting import LIVENESS_S, wait_until
from wire import exits
from wire.keys import QueueKeys

pytestmark = pytest.mark.integration
KEYS = QueueKeys()
BAD_URL = "redis://user:secret@127.0.0.1:notaport/0"


def one_error_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def test_a_malformed_redis_url_is_one_line_and_exit_2_for_worker_and_run(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n')
    for args, env in [
        (["worker", "--redis-url", BAD_URL], {}),
        (["worker"], {"RADIXQ_REDIS_URL": BAD_URL}),
        (["run", str(source), "-o", str(tmp_path / "o.jsonl"), "--redis-url", BAD_URL], {}),
        (["run", str(source), "-o", str(tmp_path / "o.jsonl")], {"RADIXQ_REDIS_URL": BAD_URL}),
    ]:
        proc = radixq(*args, env=subprocess_env(**env))
        assert proc.returncode == exits.USAGE, (args, proc.stderr)
        line = one_error_line(proc, "notaport")
        assert "secret" not in line and "***" in line, line
        if args[0] == "worker":
            where = "environment variable RADIXQ_REDIS_URL" if env else "--redis-url"
            assert line.startswith(f"error: setting [worker] redis_url (from {where}"), line
    assert not (tmp_path / "o.jsonl").exists()


def test_a_folder_or_a_missing_input_is_one_line_and_exit_2(redis_url: str, tmp_path: Path) -> None:
    out = str(tmp_path / "o.parquet")
    for path, why in [(tmp_path, "is a folder"), (tmp_path / "missing.jsonl", "no such file")]:
        for args in (
            ["enqueue", str(path), "--redis-url", redis_url],
            ["run", str(path), "-o", out, "--redis-url", redis_url],
            ["collect", "-o", out, "--join-input", str(path), "--redis-url", redis_url],
        ):
            proc = radixq(*args)
            assert proc.returncode == exits.USAGE, (args, proc.stderr)
            assert one_error_line(proc, why) == f"error: {path}: {why}" + (
                ", not an input file" if why == "is a folder" else ""
            )


def test_an_empty_input_is_nothing_to_do_for_enqueue_and_run(redis_url: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    enqueued = radixq("enqueue", str(empty), "--redis-url", redis_url)
    assert enqueued.returncode == exits.OK and "enqueued 0, skipped 0" in enqueued.stdout, enqueued.stderr
    ran = radixq("run", str(empty), "-o", str(tmp_path / "o.jsonl"), "--redis-url", redis_url)
    assert ran.returncode == exits.OK, ran.stderr
    assert "has no rows: nothing to run" in ran.stderr


def test_a_ragged_csv_row_and_a_lone_surrogate_are_their_rows_errors(redis_url: str, tmp_path: Path) -> None:
    """Each bad row is named on stderr with what is wrong with it, the other rows go in, and
    the output has the bad row's invalid_job row in its place (collect exits 1)."""
    csv_in = tmp_path / "in.csv"
    csv_in.write_text("id,prompt\na,hello\nb,world,extra,cells\nc,again\n")
    jsonl_in = tmp_path / "in.jsonl"
    jsonl_in.write_text('{"id": "s1", "prompt": "x\\ud800"}\n{"id": "s2", "prompt": "fine"}\n')
    expected = []
    for source, queue, bad, why, rows in [
        (csv_in, "csvq", "row 2", "csv: has 4 cells, the header has 2", 3),
        (jsonl_in, "jsonq", "line 1", "json: \\ud800 at character 26 is half a UTF-16 surrogate pair", 2),
    ]:
        proc = radixq("enqueue", str(source), "--redis-url", redis_url, "--queue", queue)
        assert proc.returncode == exits.JOBS_FAILED, proc.stderr
        assert f"rejected {source}:{bad}: {why}" in proc.stderr, proc.stderr
        assert f"enqueued {rows - 1}, skipped 0 (already enqueued), rejected 1" in proc.stdout
        expected.append((queue, int(bad.split()[1]), rows))
    client = redis.Redis.from_url(redis_url)
    for queue, bad_row, rows in expected:  # its invalid_job row is there, in its place, before any worker ran
        keys = QueueKeys(queue)
        assert client.llen(keys.order) == rows
        failed = {k.decode(): v.decode() for k, v in client.hgetall(keys.failed).items()}
        (row_id,) = failed
        assert failed[row_id] == "invalid_job" and client.lindex(keys.order, bad_row - 1) == row_id.encode()
    client.close()


def test_enqueue_streams_an_input_that_is_still_being_written(redis_url: str, tmp_path: Path) -> None:
    """A FIFO fed 3,000 lines and then held open: the first batches are in Redis while
    enqueue still reads (before, nothing reached Redis until the input ended)."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixq", "enqueue", str(fifo), "--redis-url", redis_url],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    client = redis.Redis.from_url(redis_url)
    release = threading.Event()

    def feed() -> None:
        with open(fifo, "w") as writer:
            for i in range(3000):
                writer.write(json.dumps({"id": f"f{i}", "prompt": "p"}) + "\n")
            writer.flush()
            release.wait(120)
            for i in range(3000, 3500):
                writer.write(json.dumps({"id": f"f{i}", "prompt": "p"}) + "\n")

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:

        def enqueued_2000() -> bool:
            assert proc.poll() is None, proc.communicate()
            return client.llen(KEYS.order) >= 2000

        wait_until(enqueued_2000, "2000 jobs enqueued while the input stays open", poll_s=0.05)
        assert proc.poll() is None  # still reading: the input is not closed yet
    finally:
        release.set()
        feeder.join()
    out, err = proc.communicate(timeout=LIVENESS_S)
    assert proc.returncode == exits.OK, err
    assert "enqueued 3500, skipped 0" in out
    assert [i.decode() for i in client.lrange(KEYS.order, 0, -1)] == [f"f{i}" for i in range(3500)]
    client.close()
