"""Collector: the spill, trimming, loss detection, requeued rows, against fakeredis.

Results are written into Redis by hand the way a worker's outbox does (result, done mark,
error code, dead letter in one MULTI), so every expected row is known independently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import fakeredis
import msgspec
import pytest

from producer.client import Client, UnknownQueueError
from producer.collector import Collector, WaitFor
from producer.spill import Spill, SpillRow
from tests.integration.results import complete, spilled
from tests.jobs_stream import job_entries, newest_entries
from wire.enqueues import finish_enqueue
from wire.keys import (
    FIELD_ENTRY,
    FIELD_EPOCH,
    FIELD_ID,
    FIELD_RESULT,
    META_RESULTS_TRIMMED,
    QueueKeys,
)
from wire.schema import Job, Result, encode, error_result
from wire.status import Heartbeat, now_ms

KEYS = QueueKeys()


def enqueue(client: fakeredis.FakeRedis, count: int) -> list[str]:
    ids = [f"j{i}" for i in range(count)]
    Client(client).enqueue([Job(id=job_id, prompt="p") for job_id in ids])
    return ids


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_results_behind_a_gap_wait_in_the_spill_not_in_redis(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    ids = enqueue(fake_redis, 300)
    entries = newest_entries(fake_redis)
    for job_id in ids[1:]:
        complete(fake_redis, job_id, entry=entries[job_id])
    collector = Collector(fake_redis)
    out = tmp_path / "out.jsonl"
    seen: list[tuple[list[str], int, int]] = []

    def between_rounds() -> bool:
        seen.append((spilled(out), fake_redis.xlen(KEYS.results), len(out.read_text().splitlines())))
        if len(seen) == 1:
            complete(fake_redis, "j0")
        return False

    report = collector.collect(out, poll_s=0.01, timeout_s=10, should_stop=between_rounds, trim=True)
    # Round 1: j0 missing, so everything behind it is in the spill (on disk), none of it in
    # Redis any more, and nothing is written yet...
    assert seen[0] == (sorted(ids[1:]), 0, 0)
    # ...round 2: j0 came, all 300 are written in order, and the spill is gone.
    assert (report.written, report.missing, report.failed, report.held) == (300, [], 0, [])
    assert [row["id"] for row in rows(out)] == ids
    assert all(row["choices"][0]["text"] == f"t {row['id']}" for row in rows(out))
    assert not (tmp_path / "out.jsonl.spill").exists()


def test_in_order_results_pass_through_the_spill_a_chunk_at_a_time(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = enqueue(fake_redis, 2500)  # more than two XREAD chunks
    entries = newest_entries(fake_redis)
    for job_id in ids:
        complete(fake_redis, job_id, entry=entries[job_id])
    held: list[int] = []
    original = Spill.put

    def put(spill: Spill, rows: Iterable[SpillRow]) -> None:
        original(spill, rows)
        held.append(len(spill.ids))

    monkeypatch.setattr(Spill, "put", put)
    report = Collector(fake_redis).collect(tmp_path / "out.jsonl", wait=False)
    assert report.written == 2500 and sum(held) == 2500  # each result spilled once...
    assert max(held) <= 1000  # ...one chunk at a time, never the whole stream
    assert spilled(tmp_path / "out.jsonl") == []


def test_trim_goes_past_results_waiting_behind_a_gap(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    ids = enqueue(fake_redis, 10)
    for job_id in ids[:5] + ids[6:]:
        complete(fake_redis, job_id)
    entries = {f[b"id"].decode(): e.decode() for e, f in fake_redis.xrange(KEYS.results)}
    ms, seq = entries["j9"].split("-")
    collector = Collector(fake_redis)
    checks: list[tuple[int, bytes | None]] = []

    def between_rounds() -> bool:
        checks.append((fake_redis.xlen(KEYS.results), fake_redis.hget(KEYS.meta, META_RESULTS_TRIMMED)))
        if len(checks) == 1:
            complete(fake_redis, "j5")
        return False

    out = tmp_path / "out.jsonl"
    report = collector.collect(out, poll_s=0.01, timeout_s=10, should_stop=between_rounds, trim=True)
    # Every result read left Redis, j6..j9 too (they wait behind j5 in the spill); the bound
    # recorded is the entry after the last one read.
    assert checks[0] == (0, f"{ms}-{int(seq) + 1}".encode())
    assert report.missing == [] and [row["id"] for row in rows(out)] == ids
    assert fake_redis.xlen(KEYS.results) == 0
    # The per-id records of the written ids are forgotten too (producer.forget); status still counts them.
    assert [fake_redis.hlen(k) for k in (KEYS.done, KEYS.enqueued)] == [0, 0] and fake_redis.llen(
        KEYS.order
    ) == 0
    status = Client(fake_redis).status()
    assert (status.enqueued, status.done, status.failed) == (10, 10, 0)


def test_results_trimmed_by_an_earlier_collect_are_reported_not_awaited(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    ids = enqueue(fake_redis, 6)
    for job_id in ids[:4]:
        complete(fake_redis, job_id)
    Collector(fake_redis).collect(tmp_path / "first.jsonl", wait=False, trim=True)
    complete(fake_redis, "j4")
    # A second output file: j0..j3 were written to the first, trimmed and forgotten (only their
    # number is left); j4 is there; j5 not done.
    report = Collector(fake_redis).collect(tmp_path / "second.jsonl", wait=True, timeout_s=1, poll_s=0.01)
    assert report.forgotten_elsewhere == 4 and report.trimmed == []
    assert report.missing == ["j5"]
    assert [row["id"] for row in rows(tmp_path / "second.jsonl")] == ["j4"]
    # With every job done, the collect ends at once instead of waiting for trimmed results.
    complete(fake_redis, "j5")
    third = Collector(fake_redis).collect(tmp_path / "third.jsonl", wait=True, poll_s=0.01)
    assert third.forgotten_elsewhere == 4 and third.written == 2


def test_results_trimmed_but_not_forgotten_are_reported_not_awaited(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    """Results trimmed while their ids are still recorded (a collect that trimmed the stream
    and stopped before forgetting them, or a collect of an older version) are named, not awaited."""
    ids = enqueue(fake_redis, 3)
    for job_id in ids:
        complete(fake_redis, job_id)
    fake_redis.xtrim(KEYS.results, minid=fake_redis.xrange(KEYS.results)[2][0], approximate=False)
    fake_redis.hset(KEYS.meta, META_RESULTS_TRIMMED, fake_redis.xrange(KEYS.results)[0][0])
    report = Collector(fake_redis).collect(tmp_path / "out.jsonl", wait=True, timeout_s=5, poll_s=0.01)
    assert report.trimmed == ids[:2] and report.missing == ids[:2] and report.written == 1


def test_requeued_dead_letter_row_is_replaced_in_place(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    ids = enqueue(fake_redis, 4)
    complete(fake_redis, "j0")
    complete(fake_redis, "j1", error="dead_letter")
    complete(fake_redis, "j2", error="dead_letter")
    complete(fake_redis, "j3")
    out = tmp_path / "out.jsonl"
    first = Collector(fake_redis).collect(out, wait=False)
    assert (first.written, first.failed) == (4, 2)
    client = Client(fake_redis)
    assert sorted(client.requeue_dead(["j1", "j2"])) == ["j1", "j2"]
    assert fake_redis.hgetall(KEYS.requeued) == {b"j1": b"1", b"j2": b"1"}
    # While the requeued jobs run, a resumed collect waits for them (their rows are superseded).
    waiting = Collector(fake_redis).collect(out, wait=True, timeout_s=0.2, poll_s=0.01)
    assert (waiting.written, waiting.replaced, sorted(waiting.missing)) == (0, 0, ["j1", "j2"])
    complete(fake_redis, "j1")  # succeeds this time
    complete(fake_redis, "j2", error="dead_letter")  # dead-lettered again
    resumed = Collector(fake_redis).collect(out, wait=True, timeout_s=5, poll_s=0.01)
    assert (resumed.written, resumed.replaced, resumed.missing, resumed.failed) == (0, 1, [], 1)
    final = rows(out)
    assert [row["id"] for row in final] == ids
    assert final[1]["error"] is None and final[1]["choices"][0]["text"] == "t j1"
    assert final[2]["error"]["code"] == "dead_letter"
    again = Collector(fake_redis).collect(out, wait=True, timeout_s=5, poll_s=0.01)
    assert (again.written, again.replaced, again.missing) == (0, 0, [])
    assert rows(out) == final


def test_lost_queue_is_detected_by_a_running_collector(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    ids = enqueue(fake_redis, 5)
    complete(fake_redis, "j0")
    collector = Collector(fake_redis)

    def lose_everything() -> bool:
        fake_redis.flushall()  # Redis restarted without its data
        return False

    out = tmp_path / "out.jsonl"
    report = collector.collect(out, wait=True, poll_s=0.01, timeout_s=5, should_stop=lose_everything)
    assert report.lost is not None and "no longer knows this queue" in report.lost
    assert report.missing == ids[1:] and [row["id"] for row in rows(out)] == ["j0"]


def test_shorter_order_list_is_a_loss(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    enqueue(fake_redis, 5)
    collector = Collector(fake_redis)

    def lose_last_writes() -> bool:
        fake_redis.rpop(KEYS.order, 2)  # an AOF that lost its last second of writes
        return False

    report = collector.collect(tmp_path / "o.jsonl", poll_s=0.01, timeout_s=5, should_stop=lose_last_writes)
    assert report.lost is not None and "from 5 to 3 ids" in report.lost


def test_unknown_queue_raises_and_creates_no_file(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    enqueue(fake_redis, 1)
    out = tmp_path / "o.jsonl"
    with pytest.raises(UnknownQueueError, match="unknown queue 'other'"):
        Collector(fake_redis, "other").collect(out)
    assert not out.exists()
    # A consumer group recreated by a worker after a loss does not make the queue known.
    Client(fake_redis, "other").redis.xgroup_create(QueueKeys("other").jobs, "workers", mkstream=True)
    with pytest.raises(UnknownQueueError):
        Client(fake_redis, "other").status()


def test_resumed_collect_on_a_queue_redis_lost_is_a_loss(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    enqueue(fake_redis, 3)
    complete(fake_redis, "j0")
    complete(fake_redis, "j1")
    out = tmp_path / "out.jsonl"
    Collector(fake_redis).collect(out, wait=False)
    entry = newest_entries(fake_redis)["j2"]
    fake_redis.flushall()
    # After the restart a worker's outbox delivers j2's result into the empty Redis.
    result = encode(error_result("j2", "internal", "x"))
    fake_redis.xadd(KEYS.results, {FIELD_ID: "j2", FIELD_ENTRY: entry, FIELD_RESULT: result})
    fake_redis.hset(KEYS.done, "j2", entry)
    report = Collector(fake_redis).collect(out, wait=True, timeout_s=5)
    assert report.lost is not None and "output already holds 2 rows" in report.lost


def test_results_of_a_lost_queue_are_never_written(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    """Results tagged with an epoch the queue no longer has (a worker that held jobs when Redis
    restarted empty, written before workers checked): a fresh collect writes none of them and
    reports the loss."""
    enqueue(fake_redis, 3)
    epoch = fake_redis.hget(KEYS.meta, "epoch")
    entries = newest_entries(fake_redis)
    fake_redis.flushall()
    for job_id in ("j0", "j1"):
        result = encode(error_result(job_id, "internal", "x"))
        fields = {FIELD_ID: job_id, FIELD_ENTRY: entries[job_id], FIELD_RESULT: result, FIELD_EPOCH: epoch}
        fake_redis.xadd(KEYS.results, fields)
        fake_redis.hset(KEYS.done, job_id, entries[job_id])
    out = tmp_path / "out.jsonl"
    report = Collector(fake_redis).collect(out, wait=False)
    assert report.lost is not None and f"read under epoch {epoch.decode()}" in report.lost
    assert "the queue has no epoch" in report.lost
    assert report.written == 0 and out.read_text() == ""


def test_rejected_rows_keep_their_place_through_requeue(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    """Rows rejected at enqueue go in as invalid_job results in input order; the collect writes
    one row per input row, in that order, before and after a dead letter is requeued."""
    items: list[Job | Result] = [
        Job(id="a", prompt="p"),
        error_result("bad1", "invalid_job", "line 2: no prompt"),
        Job(id="b", prompt="p"),
        error_result("bad2", "invalid_job", "line 4: n=0"),
        Job(id="c", prompt="p"),
    ]
    client = Client(fake_redis)
    report = client.enqueue(items)
    assert report.enqueued == ["a", "bad1", "b", "bad2", "c"]
    assert client.enqueue(items).skipped == report.enqueued  # idempotent, rejected rows too
    assert sorted(f[b"id"] for _, f in job_entries(fake_redis)) == [b"a", b"b", b"c"]  # no work for them
    complete(fake_redis, "c")
    complete(fake_redis, "b", error="dead_letter")
    complete(fake_redis, "a")
    out = tmp_path / "out.jsonl"
    Collector(fake_redis).collect(out, wait=False)
    assert [(row["id"], (row["error"] or {}).get("code")) for row in rows(out)] == [
        ("a", None),
        ("bad1", "invalid_job"),
        ("b", "dead_letter"),
        ("bad2", "invalid_job"),
        ("c", None),
    ]
    assert client.requeue_dead(["b"]) == ["b"]
    complete(fake_redis, "b")
    resumed = Collector(fake_redis).collect(out, wait=True, timeout_s=5, poll_s=0.01)
    assert resumed.replaced == 1 and resumed.failed == 2
    assert [row["id"] for row in rows(out)] == ["a", "bad1", "b", "bad2", "c"]
    assert rows(out)[2]["error"] is None


def test_a_trimming_collect_forgets_what_it_wrote_and_keeps_collecting(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    """Ids enqueued while a trimming collect forgets the ones before them are still collected,
    in order and once, with no loss reported (the order list is shorter, the count in meta
    says why); a resumed collect into the same output goes on from there."""
    client = Client(fake_redis)
    first = [f"a{i}" for i in range(5)]
    client.enqueue([Job(id=i, prompt="p") for i in first])
    for job_id in first[:4]:
        complete(fake_redis, job_id)
    later = [f"b{i}" for i in range(4)]
    rounds: list[int] = []

    def between_rounds() -> bool:
        rounds.append(fake_redis.llen(KEYS.order))
        if len(rounds) == 1:  # after the first round wrote and forgot a0..a3
            client.enqueue([Job(id=i, prompt="p") for i in later])
            for job_id in ["a4", *later]:
                complete(fake_redis, job_id)
        return False

    out = tmp_path / "out.jsonl"
    report = Collector(fake_redis).collect(
        out, poll_s=0.01, timeout_s=10, should_stop=between_rounds, trim=True
    )
    assert rounds[0] == 1 and report.lost is None and report.missing == []
    assert [row["id"] for row in rows(out)] == first + later
    assert fake_redis.llen(KEYS.order) == 0 and fake_redis.hlen(KEYS.enqueued) == 0
    client.enqueue([Job(id="c0", prompt="p")])
    complete(fake_redis, "c0")
    again = Collector(fake_redis).collect(out, wait=True, timeout_s=10, poll_s=0.01, trim=True)
    assert (again.written, again.already, again.missing, again.lost) == (1, 9, [], None)
    assert [row["id"] for row in rows(out)] == [*first, *later, "c0"]
    status = client.status()
    assert (status.enqueued, status.done, status.results_kept) == (10, 10, 0)


def test_a_wait_with_no_live_worker_says_so_once(fake_redis: fakeredis.FakeRedis, tmp_path: Path) -> None:
    """Issue 30, item 8: a collect waiting on a queue nothing consumes says so within 30 s, once
    (not every progress line); a worker that comes (a fresh heartbeat) and goes again makes it
    say so once more. The collector's clock is simulated: one second per round."""
    enqueue(fake_redis, 3)
    now = [0.0]
    said: list[tuple[float, str]] = []
    collector = Collector(fake_redis, say=lambda line: said.append((now[0], line)), clock=lambda: now[0])

    def tick() -> bool:
        now[0] += 1.0
        if now[0] == 40:  # a worker beats (heartbeat ages are real time: this one is fresh)
            beat = Heartbeat(name="w1", pid=1, last_seen_ms=now_ms(), interval_s=2.0)
            fake_redis.hset(KEYS.workers, "w1", msgspec.msgpack.encode(beat))
        if now[0] == 60:  # and is gone
            fake_redis.hdel(KEYS.workers, "w1")
        return now[0] >= 90

    report = collector.collect(tmp_path / "out.jsonl", poll_s=0.001, should_stop=tick, watch_consumers=True)
    assert report.missing == ["j0", "j1", "j2"]
    warned = [(at, line) for at, line in said if "no worker is consuming queue 'default'" in line]
    assert len(warned) == 2, said
    assert warned[0][0] <= 30 and 60 < warned[1][0] <= 90, warned
    assert "radixq worker --queue default" in warned[0][1]


@pytest.mark.parametrize(
    ("until", "stops_at"),
    [
        (WaitFor(), 0),  # what was enqueued so far is written: done at once
        (WaitFor(jobs=6), 20),  # the second batch brings the queue to 6 jobs
        (WaitFor(enqueues=2), 30),  # the second enqueue that finished is counted at t=30
        (WaitFor(idle_s=25), 45),  # 25 s with nothing new after the last jobs came (t=20)
    ],
)
def test_a_waiting_collect_waits_for_what_is_coming(
    until: WaitFor, stops_at: int, fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    """Issue 30, item 3: producers still at work when collect catches up. At t=0 three jobs
    are there and done; at t=20 three more come, done at once; at t=30 both producers say they
    finished (wire.enqueues). The collector's clock is simulated: one second per round."""
    ids = enqueue(fake_redis, 3)
    client = Client(fake_redis)
    for job_id in ids:
        complete(fake_redis, job_id)
    now = [0.0]

    def tick() -> bool:
        now[0] += 1.0
        if now[0] == 20:
            client.enqueue([Job(id=f"later{i}", prompt="p") for i in range(3)])
            for i in range(3):
                complete(fake_redis, f"later{i}")
        if now[0] == 30:
            finish_enqueue(fake_redis, KEYS)
            finish_enqueue(fake_redis, KEYS)
        return now[0] >= 60

    report = Collector(fake_redis, clock=lambda: now[0]).collect(
        tmp_path / "out.jsonl", poll_s=0.001, should_stop=tick, until=until
    )
    assert now[0] == stops_at and report.missing == [] and report.short is None
    assert len(rows(tmp_path / "out.jsonl")) == (3 if stops_at == 0 else 6)


def test_a_collect_stopped_before_the_expected_jobs_came_says_so(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    enqueue(fake_redis, 2)
    report = Collector(fake_redis).collect(
        tmp_path / "out.jsonl", timeout_s=0.1, poll_s=0.01, until=WaitFor(jobs=5)
    )
    assert report.short == "2 of the 5 jobs expected (--expect) were enqueued"
    # Expecting jobs, a collect started before the queue exists waits for it instead of failing.
    other = Collector(fake_redis, "later").collect(
        tmp_path / "o.jsonl", timeout_s=0.1, poll_s=0.01, until=WaitFor(jobs=1)
    )
    assert other.short == "0 of the 1 jobs expected (--expect) were enqueued"
