"""The canceller (producer.cancel) and tags (producer.tags) against fakeredis: each job without
a result gets exactly one ``cancelled`` result carrying its metadata, in the shape its input
had; jobs with a result keep it; tags, given ids and the whole queue select the same way.
Results of finished jobs are written by hand the way a worker does (tests/integration/results.py),
so every expected row is known independently."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis
import pytest

from producer.cancel import Canceller, CancelLost, cancelled_result, read_ids
from producer.client import Client, UnknownQueueError
from producer.collector import Collector
from producer.jsonl import parse_line
from producer.rewrite import split_errors
from tests.integration.results import complete_all
from tests.jobs_stream import newest_entries, stream_of
from wire.keys import FIELD_ID, QueueKeys
from wire.routing import read_routing
from wire.schema import Job, decode_result

KEYS = QueueKeys()


def enqueue(redis: fakeredis.FakeRedis, ids: list[str], tag: str | None = None) -> Client:
    client = Client(redis)
    client.enqueue([Job(id=i, prompt=f"p {i}", metadata={"row": i}) for i in ids], tag=tag)
    return client


def results_by_id(redis: fakeredis.FakeRedis) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for _, fields in redis.xrange(KEYS.results):
        result = decode_result(fields[b"result"])
        found.setdefault(result.id, []).append({"code": result.error.code if result.error else None,
                                                 "metadata": result.metadata})  # fmt: skip
    return found


def collected(redis: fakeredis.FakeRedis, tmp_path: Path) -> list[dict]:
    out = tmp_path / "out.jsonl"
    report = Collector(redis).collect(out, wait=False, trim=False)
    assert report.missing == []
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_every_job_without_a_result_gets_one_cancelled_result(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    ids = [f"j{i}" for i in range(10)]
    client = enqueue(fake_redis, ids)
    complete_all(fake_redis, ids[:3])
    report = client.cancel()
    assert (report.scope, report.cancelled, report.unknown, report.without_entry) == (10, 7, [], 0)
    found = results_by_id(fake_redis)
    assert sorted(found) == ids and all(len(found[i]) == 1 for i in ids)  # one result each
    assert [found[i][0]["code"] for i in ids] == [None] * 3 + ["cancelled"] * 7
    assert all(found[i][0]["metadata"] == {"row": i} for i in ids[3:])
    assert client.cancel().cancelled == 0  # idempotent
    rows = collected(fake_redis, tmp_path)
    assert [row["id"] for row in rows] == ids  # input order, each once
    assert [row["error"]["code"] if row["error"] else None for row in rows] == [None] * 3 + ["cancelled"] * 7
    assert rows[5]["choices"] == [] and rows[5]["metadata"] == {"row": "j5"}
    assert not list(fake_redis.scan_iter(match="*cancelling*"))
    status = client.status()
    assert (status.cancelled, status.failed, status.done) == (7, 7, 10)


def test_given_ids_only_and_unknown_ids_are_named(fake_redis: fakeredis.FakeRedis) -> None:
    ids = [f"j{i}" for i in range(6)]
    client = enqueue(fake_redis, ids)
    complete_all(fake_redis, ["j0"])
    report = client.cancel(["j0", "j1", "j2", "nosuch"])
    assert (report.scope, report.cancelled, report.unknown) == (4, 2, ["nosuch"])
    assert {i: r[0]["code"] for i, r in results_by_id(fake_redis).items()} == {
        "j0": None, "j1": "cancelled", "j2": "cancelled"
    }  # fmt: skip
    assert not list(fake_redis.scan_iter(match="*cancelling*"))  # its filter set is gone


def test_cancel_by_tag_takes_the_tag_and_a_job_keeps_its_first_tag(fake_redis: fakeredis.FakeRedis) -> None:
    enqueue(fake_redis, ["a0", "a1", "a2"], tag="batch_a")
    enqueue(fake_redis, ["b0", "b1", "a2"], tag="batch_b")  # a2 again: skipped, keeps batch_a
    assert fake_redis.smembers(KEYS.tag("batch_a")) == {b"a0", b"a1", b"a2"}
    assert fake_redis.smembers(KEYS.tag("batch_b")) == {b"b0", b"b1"}
    client = Client(fake_redis)
    report = client.cancel(tag="batch_b")
    assert (report.scope, report.cancelled) == (2, 2)
    assert sorted(results_by_id(fake_redis)) == ["b0", "b1"]
    assert client.cancel(tag="no-such-tag").scope == 0
    assert client.cancel(tag="batch_a").cancelled == 3


def test_a_trimming_collect_forgets_the_tags_of_what_it_wrote(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    ids = [f"t{i}" for i in range(5)]
    enqueue(fake_redis, ids, tag="T")
    enqueue(fake_redis, ["u0"])
    complete_all(fake_redis, ids[:2])
    Client(fake_redis).cancel(tag="T")
    complete_all(fake_redis, ["u0"])
    Collector(fake_redis).collect(tmp_path / "out.jsonl", wait=False, trim=True)
    assert not fake_redis.exists(KEYS.tag("T")) and not fake_redis.exists(KEYS.tags)


def test_an_openai_batch_line_is_cancelled_as_an_openai_error_line(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    line = {"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"k": "v"}}}  # fmt: skip
    job = parse_line(json.dumps(line), 1)
    client = Client(fake_redis)
    client.enqueue([job])
    assert client.cancel().cancelled == 1
    (row,) = collected(fake_redis, tmp_path)
    # OpenAI's error-file line: custom_id, no response, the error OpenAI gives a cancelled request
    assert set(row) == {"id", "custom_id", "response", "error", "job_digest"}
    assert row["custom_id"] == "req-1" and row["response"] is None and row["id"].startswith("batch_req_")
    assert row["error"]["code"] == "batch_cancelled" and "cancelled" in row["error"]["message"]


def test_cancelled_rows_go_to_the_errors_file(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    ids = ["e0", "e1", "e2", "e3"]
    client = enqueue(fake_redis, ids)
    complete_all(fake_redis, ["e1", "e3"])
    client.cancel()
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    Collector(fake_redis).collect(out, wait=False, trim=False)
    split_errors(out, errors, [], ids)
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["e1", "e3"]
    assert [json.loads(x)["id"] for x in errors.read_text().splitlines()] == ["e0", "e2"]


def test_a_job_whose_entry_is_gone_is_cancelled_without_metadata(fake_redis: fakeredis.FakeRedis) -> None:
    client = enqueue(fake_redis, ["x0", "x1"])
    stream, raw = stream_of(newest_entries(fake_redis)["x1"])
    fake_redis.xdel(stream, raw)
    report = client.cancel()
    assert (report.cancelled, report.without_entry) == (2, 1)
    found = results_by_id(fake_redis)
    assert found["x0"][0]["metadata"] == {"row": "x0"} and found["x1"][0]["metadata"] == {}


def test_the_scan_script_and_the_cluster_scan_find_the_same_entries(fake_redis: fakeredis.FakeRedis) -> None:
    """StreamScan.chunk's script (one slot) and .apart (a partition in a slot of its own) are two
    readings of one rule: the filter's entries whose job is enqueued and not done."""
    ids = [f"s{i}" for i in range(30)]
    client = enqueue(fake_redis, ids, tag="S")
    enqueue(fake_redis, ["other"])
    complete_all(fake_redis, ids[:5])
    fake_redis.xadd(KEYS.jobs, {FIELD_ID: "raw", "job": b""})  # never enqueued through a Client
    canceller = Canceller(fake_redis, KEYS, "epoch", client.backoff)
    for filter_key, expected in ((KEYS.tag("S"), ids[5:]), (None, ids[5:] + ["other"])):
        for scan in (canceller.scan.chunk, canceller.scan.apart):
            found = []
            for p in range(read_routing(fake_redis, KEYS)[0]):
                start = "-"
                while True:
                    last, chunk = scan(KEYS.partition(p), start, filter_key)
                    found += [job_id.decode() for _, job_id, _ in chunk]
                    if not last:
                        break
                    start = "(" + last
            assert sorted(found) == sorted(expected), scan


def test_a_queue_lost_while_cancelling_is_said_and_nothing_written(fake_redis: fakeredis.FakeRedis) -> None:
    client = enqueue(fake_redis, ["l0"])
    with pytest.raises(CancelLost, match="Redis lost the queue while cancel ran"):
        Canceller(fake_redis, KEYS, "an-older-epoch", client.backoff).run(None, None)
    assert fake_redis.xlen(KEYS.results) == 0
    fake_redis.hdel(KEYS.meta, "epoch")
    with pytest.raises(CancelLost, match="has no epoch"):
        client.cancel()
    with pytest.raises(UnknownQueueError):
        Client(fake_redis, "nosuch").cancel()


def test_ids_files_name_ids_one_a_line_or_as_rows(tmp_path: Path) -> None:
    path = tmp_path / "ids"
    path.write_text('a\n\n  b  \n{"custom_id": "c", "id": "x"}\n{"id": "d"}\na\n')
    assert read_ids(str(path)) == ["a", "b", "c", "d"]
    path.write_text('a\n{"prompt": "no id"}\n')
    with pytest.raises(ValueError, match="line 2: a JSON row with no custom_id or id"):
        read_ids(str(path))


def test_a_cancelled_result_of_an_undecodable_payload_still_names_its_job() -> None:
    result = cancelled_result("j", b"\xff not msgpack")
    assert result.id == "j" and result.error is not None and result.error.code == "cancelled"
    assert result.metadata == {}
