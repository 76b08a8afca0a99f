"""Exit codes and one-line errors of enqueue, collect, status and dlq, run as subprocesses.

0: all done; 1: some jobs failed, were rejected, are missing or lost; 2: usage, connection,
auth/ACL errors and unknown queues, always one `error:` line and never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.local_redis import LocalRedis, free_port
from tests.conftest import require_redis_server
from tests.integration.procs import radixq
from tests.jobs_stream import job_entries, newest_entries
from wire import exits
from wire.keys import FIELD_ENTRY, FIELD_ID, FIELD_RESULT, QueueKeys
from wire.schema import Choice, Job, Result, encode, error_result

pytestmark = pytest.mark.integration
KEYS = QueueKeys()


def complete(client: redis.Redis, job_id: str, error: str | None = None) -> None:
    """Write a job's counted result the way a worker's outbox does."""
    entry = newest_entries(client, KEYS)[job_id]
    if error is None:
        result = Result(id=job_id, choices=[Choice(index=0, text="t", token_ids=[], finish_reason="stop")])
    else:
        result = error_result(job_id, error, "failed on purpose")
    with client.pipeline(transaction=True) as pipe:
        pipe.xadd(KEYS.results, {FIELD_ID: job_id, FIELD_ENTRY: entry, FIELD_RESULT: encode(result)})
        pipe.hsetnx(KEYS.done, job_id, entry)
        if error is not None:
            pipe.hset(KEYS.failed, job_id, error)
        pipe.execute()


def assert_one_line_error(proc, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], errors[0]


def test_unreachable_redis_is_exit_2_with_one_line(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n')
    commands = [
        ("enqueue", str(source)),
        ("collect", "-o", str(tmp_path / "out.jsonl")),
        ("status",),
        ("dlq", "list"),
        ("dlq", "requeue", "a"),
        ("cancel",),
    ]
    for command in commands:
        retry = (
            ["--retry-timeout-s", "0"]
            if command[0] in ("enqueue", "collect", "cancel") or "requeue" in command
            else []
        )
        proc = radixq(*command, "--redis-url", url, *retry)
        assert proc.returncode == exits.USAGE, (command, proc.stderr)
        assert_one_line_error(proc, url, "Connection refused", "is redis-server running")
        assert len(proc.stderr.splitlines()) == 1, (command, proc.stderr)
    enqueue = radixq("enqueue", str(source), "--redis-url", url, "--retry-timeout-s", "0")
    # NOTE: enqueue asks Redis about the file's ids before it validates a line (producer.idscan)
    assert "enqueued 0 (0 already enqueued) of 0 valid jobs read, then stopped" in enqueue.stderr


def test_enqueue_codes(redis_url: str, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"id": f"g{i}", "prompt": "x"}) + "\n" for i in range(3)))
    assert radixq("enqueue", str(good), "--redis-url", redis_url).returncode == exits.OK
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"id": "m0", "prompt": "x"}\n{"id": "m1"}\n{"id": "m2", "prompt": "y"}\n')
    proc = radixq("enqueue", str(mixed), "--redis-url", redis_url)
    assert proc.returncode == exits.JOBS_FAILED, proc.stderr
    assert "enqueued 2, skipped 0 (already enqueued), rejected 1" in proc.stdout
    assert f"rejected {mixed}:line 2" in proc.stderr
    # The valid lines went in despite the rejected one, which holds its place as an error result.
    client = Client.from_url(redis_url)
    assert client.order() == ["g0", "g1", "g2", "m0", "m1", "m2"]
    assert client.redis.hget(KEYS.failed, "m1") == b"invalid_job"
    assert b"m1" not in [f[b"id"] for _, f in job_entries(client.redis, KEYS)]
    client.close()
    missing = radixq("enqueue", str(tmp_path / "nope.jsonl"), "--redis-url", redis_url)
    assert missing.returncode == exits.USAGE and "Traceback" not in missing.stderr
    bad_url = radixq("enqueue", str(good), "--redis-url", "http://x")
    assert bad_url.returncode == exits.USAGE
    assert_one_line_error(bad_url, "--redis-url")


def test_collect_codes(redis_url: str, tmp_path: Path) -> None:
    client = Client.from_url(redis_url)
    client.enqueue([Job(id=f"c{i}", prompt="x") for i in range(3)])
    complete(client.redis, "c0")
    complete(client.redis, "c1")
    out = tmp_path / "out.jsonl"
    partial = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--no-wait")
    assert partial.returncode == exits.JOBS_FAILED, partial.stderr
    assert "1 job has no result yet, e.g. c2" in partial.stderr
    timed_out = radixq("collect", "-o", str(out), "--redis-url", redis_url, "--timeout", "0.5")
    assert timed_out.returncode == exits.JOBS_FAILED
    complete(client.redis, "c2")
    done = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert done.returncode == exits.OK, done.stderr
    assert "wrote 1 results" in done.stdout and "(2 already there)" in done.stdout

    client.enqueue([Job(id="c3", prompt="x")])
    complete(client.redis, "c3", error="internal")
    failed = radixq("collect", "-o", str(out), "--redis-url", redis_url)
    assert failed.returncode == exits.JOBS_FAILED
    assert "1 job failed" in failed.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["c0", "c1", "c2", "c3"]
    # Those results were trimmed and their ids forgotten once written: a collect into another
    # file reports how many.
    other = radixq("collect", "-o", str(tmp_path / "other.jsonl"), "--redis-url", redis_url)
    assert other.returncode == exits.JOBS_FAILED
    assert "4 jobs were collected earlier by a trimming collect into another output" in other.stderr
    assert client.redis.xlen(KEYS.results) == 0 and client.redis.hlen(KEYS.done) == 0
    # An output file that is not radixq's is refused in one line.
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    refused = radixq("collect", "-o", str(junk), "--redis-url", redis_url)
    assert refused.returncode == exits.USAGE
    assert_one_line_error(refused, "line 1 is not a radixq output row")
    client.close()


def test_unknown_queue_is_exit_2(redis_url: str, tmp_path: Path) -> None:
    Client.from_url(redis_url).enqueue([Job(id="k", prompt="x")])
    out = tmp_path / "out.jsonl"
    for command in (("collect", "-o", str(out)), ("status",), ("status", "--json"), ("dlq", "list")):
        proc = radixq(*command, "--redis-url", redis_url, "--queue", "nosuch")
        assert proc.returncode == exits.USAGE, proc
        assert_one_line_error(proc, "unknown queue 'nosuch' (never enqueued, or Redis lost it)")
    assert not out.exists()
    assert radixq("status", "--redis-url", redis_url).returncode == exits.OK


def test_auth_and_acl_errors_are_exit_2_with_one_line(tmp_path: Path) -> None:
    require_redis_server()
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "x"}\n')
    with LocalRedis(use_server=True, appendonly=False) as server:
        admin = redis.Redis(port=server.port)
        admin.acl_setuser(
            "reader", enabled=True, passwords=["+readpw"], keys=["*"], commands=["+@read", "+ping"]
        )
        admin.config_set("requirepass", "secret")
        host = f"127.0.0.1:{server.port}/0"
        cases = [
            (f"redis://{host}", "Authentication required"),
            (f"redis://:wrong@{host}", "check the password"),
            (f"redis://reader:readpw@{host}", "lacks a permission"),
        ]
        for url, words in cases:
            proc = radixq("enqueue", str(source), "--redis-url", url)
            assert proc.returncode == exits.USAGE, proc.stderr
            assert_one_line_error(proc, words)
            assert "wrong" not in proc.stderr and "readpw" not in proc.stderr  # passwords redacted
        proc = radixq("status", "--redis-url", f"redis://:wrong@{host}")
        assert proc.returncode == exits.USAGE
        assert_one_line_error(proc, "check the password")
        admin.close()
