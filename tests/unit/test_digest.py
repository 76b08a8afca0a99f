"""Content digests (issue 17, item 3): an id enqueued again with other content is told apart
from the same row again, and is kept, refused or run again, never silently answered with the
old result. The queue is fakeredis; the oracle is what the test enqueued and completed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fakeredis
import msgspec
import pytest

from producer.client import Client, ContentChanged
from producer.collector import Collector
from producer.digest import REJECTED, job_digest
from producer.jsonl import parse_line
from tests.jobs_stream import job_entries, newest_entries
from wire.keys import FIELD_ENTRY, FIELD_ID, FIELD_RESULT, QueueKeys
from wire.schema import Choice, Job, Result, SamplingParams, encode, error_result

KEYS = QueueKeys()


def test_a_digest_covers_content_not_defaults_time_or_routing() -> None:
    job = Job(id="a", prompt="Hi", metadata={"k": 1})
    assert job_digest(job) == job_digest(parse_line('{"id": "a", "metadata": {"k": 1}, "prompt": "Hi"}', 1))
    assert job_digest(job) == job_digest(
        Job(id="a", prompt="Hi", metadata={"k": 1}, sampling=SamplingParams())
    )
    assert job_digest(job) == job_digest(msgspec.structs.replace(job, enqueued_at_ms=123, prefix_key="p"))
    others = [
        msgspec.structs.replace(job, prompt="Hi!"),
        msgspec.structs.replace(job, metadata={"k": 2}),
        msgspec.structs.replace(job, model="m"),
        msgspec.structs.replace(job, sampling=SamplingParams(max_tokens=7)),
        msgspec.structs.replace(job, id="b"),
    ]
    assert len({job_digest(other) for other in [job, *others]}) == 6
    assert job_digest(error_result("a", "invalid_job", "line 1: bad")) == REJECTED


def finish(client: fakeredis.FakeRedis, job_id: str, text: str) -> None:
    """What a worker does: the result, its done mark (the entry it answers) and the ack."""
    entry = newest_entries(client)[job_id]
    result = Result(id=job_id, choices=[Choice(index=0, text=text, token_ids=[1], finish_reason="stop")])
    client.xadd(KEYS.results, {FIELD_ID: job_id, FIELD_ENTRY: entry, FIELD_RESULT: encode(result)})
    client.hsetnx(KEYS.done, job_id, entry)


def test_changed_ids_are_kept_reported_or_run_again_and_their_rows_replaced(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    client = Client(fake_redis)
    first = [Job(id="a", prompt="one"), Job(id="b", prompt="two"), Job(id="c", prompt="three")]
    client.enqueue(first)
    for job in first[:2]:
        finish(fake_redis, job.id, f"old {job.id}")
    out = tmp_path / "out.jsonl"
    Collector(fake_redis).collect(out, wait=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(row["id"], row["job_digest"]) for row in rows] == [(j.id, job_digest(j)) for j in first[:2]]

    edited = [
        Job(id="a", prompt="one, edited"),
        first[1],
        Job(id="c", prompt="three, edited"),
        Job(id="d", prompt="4"),
    ]
    with pytest.raises(ContentChanged) as refused:  # before anything is written
        client.enqueue(edited, refuse_changed=True)
    assert refused.value.ids == ["a", "c"] and fake_redis.hget(KEYS.enqueued, "d") is None
    kept = client.enqueue(edited)
    assert (kept.enqueued, kept.skipped, kept.changed, kept.rerun) == (["d"], ["b"], ["a", "c"], [])
    assert fake_redis.hget(KEYS.digests, "a").decode() == job_digest(first[0])  # kept as it was

    again = client.enqueue(edited, rerun_changed=True)
    # a is done: it runs again; c is still queued with its first content: kept, and said
    assert (again.enqueued, again.skipped, again.changed, again.rerun) == ([], ["b", "d"], ["c"], ["a"])
    assert fake_redis.hget(KEYS.done, "a") is None and client.order() == ["a", "b", "c", "d"]
    newest = [fields for _, fields in job_entries(fake_redis) if fields[b"id"] == b"a"][-1]
    assert msgspec.msgpack.decode(newest[b"job"])["prompt"] == "one, edited"

    finish(fake_redis, "a", "new a")
    report = Collector(fake_redis).collect(out, ids=["a", "b"], wait=False)
    assert report.replaced == 1 and report.missing == []
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert rows["a"]["choices"][0]["text"] == "new a" and rows["a"]["job_digest"] == job_digest(edited[0])
    assert rows["b"]["choices"][0]["text"] == "old b"


def reference_digest(content: dict[str, object]) -> str:
    """The digest by its definition, from the standard library: SHA-256 of the content as
    sorted, compact JSON (UTF-8), its first 16 hex digits."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_digests_stay_what_enqueued_queues_and_written_rows_hold() -> None:
    lines = [
        '{"id": "a", "prompt": "Grüße", "max_tokens": 32, "temperature": 0.7, "metadata": {"row": 1}}',
        '{"id": "b", "prompt": "Hi", "temperature": 0.7, "max_tokens": 32}',  # the same sampling, shared
        '{"id": "c", "messages": [{"role": "user", "content": "x"}], "stop": ["\\n"], "seed": 3}',
    ]
    a, b, c = (parse_line(line, n) for n, line in enumerate(lines, 1))
    sampling = {"max_tokens": 32, "temperature": 0.7}
    assert job_digest(a) == reference_digest(
        {"id": "a", "prompt": "Grüße", "metadata": {"row": 1}, "sampling": sampling}
    )
    assert job_digest(b) == reference_digest({"id": "b", "prompt": "Hi", "sampling": sampling})
    assert job_digest(c) == reference_digest(
        {"id": "c", "messages": [{"role": "user", "content": "x"}], "sampling": {"stop": ["\n"], "seed": 3}}
    )
    other = Job(id="b", prompt="Hi", sampling=SamplingParams(max_tokens=32, temperature=0.5))
    assert job_digest(other) == reference_digest({"id": "b", "prompt": "Hi", "sampling": {"max_tokens": 32, "temperature": 0.5}})
