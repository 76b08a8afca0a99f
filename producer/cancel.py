"""Cancel: the jobs of a queue (all, a tag's, or given ids) that have no result yet get a
``cancelled`` error result, written exactly once; collect writes it as an error row.

    radixq cancel -q Q [--ids FILE | --tag T]          Client.cancel(ids=None, tag=None)

    1. filter  which jobs: every one, a tag's set (producer.tags), or the given ids put in a
               set of this call's own (QueueKeys.cancelling), deleted when it ends
    2. scan    each partition stream (producer.cancel_scan: a script returns only the
               entries of the filter's jobs that are enqueued and not done, payload and all)
    3. write   for each, a Result carrying the job's metadata (so its row has the format the
               job came in: an OpenAI batch error line), by a script (_WRITE) that under the
               queue's epoch writes it only for a job still without a result: XADD result
               (entry "cancelled"), HSET done, HSET failed, INCRBY the cancelled counter
    4. check   the filter's jobs still enqueued and not done: scanned once more (an entry added
               behind the scan: a job given back by a draining worker); those still left have
               no entry at all, and get their row without metadata

The done mark decides, as for workers (worker.queue.streams.writes): a worker writing the same
job's result at the same moment runs its script before or after _WRITE, and the second finds
the mark and writes nothing, so each id has one result, its real one if that was written first.
A worker acknowledges, without running it, an entry whose job is done (reclaimed ones too), and
when the counter moves it aborts the jobs it holds that are done (worker.queue.held). Cancel is
idempotent: a second call finds nothing left to cancel.

Cost: the scan reads every entry left in the partition streams (not yet delivered, held, or
acknowledged and not trimmed yet) on the server, a few hundred at a time; only the filter's jobs
travel. The checks read the scope's ids (the order list, the tag's set, the given ids) 2,000 at a
time. Jobs enqueued while a cancel of the whole queue runs may or may not be cancelled.
"""

from __future__ import annotations

import json
import secrets
import string
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis

from producer.cancel_scan import StreamScan
from wire.epoch import read_epoch
from wire.keys import (
    CANCELLING_TTL_S,
    ENTRY_CANCELLED,
    FIELD_ENTRY,
    FIELD_EPOCH,
    FIELD_ID,
    FIELD_RESULT,
    META_EPOCH,
    QueueKeys,
)
from wire.retry import Backoff
from wire.routing import read_routing
from wire.schema import CANCELLED, Job, JobError, Result, Timings, decode_job, encode, error_result
from wire.status import now_ms

WRITE_COUNT = 100  # results one write call writes
CHECK_COUNT = 2000  # ids one check reads (one HMGET of each hash)
SCANS = 2  # full scans before the ids left get rows without metadata

# KEYS: meta, results, done, failed, enqueued, the cancelled counter.
# ARGV: the epoch the results were made under, then (id, encoded result) pairs.
# Returns {written, the queue's epoch}; written -1: the epoch differs (nothing written).
_WRITE = string.Template("""
local current = redis.call('HGET', KEYS[1], '$META_EPOCH') or ''
if current ~= ARGV[1] then return {-1, current} end
local written = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[3], id) == 0 and redis.call('HEXISTS', KEYS[5], id) == 1 then
    redis.call('XADD', KEYS[2], '*', '$FIELD_ID', id, '$FIELD_ENTRY', '$ENTRY', '$FIELD_RESULT', ARGV[i + 1],
      '$FIELD_EPOCH', current)
    redis.call('HSET', KEYS[3], id, '$ENTRY')
    redis.call('HSET', KEYS[4], id, '$CODE')
    written = written + 1
  end
end
if written > 0 then redis.call('INCRBY', KEYS[6], written) end
return {written, current}
""").substitute(
    META_EPOCH=META_EPOCH,
    FIELD_ID=FIELD_ID,
    FIELD_ENTRY=FIELD_ENTRY,
    FIELD_RESULT=FIELD_RESULT,
    FIELD_EPOCH=FIELD_EPOCH,
    ENTRY=ENTRY_CANCELLED,
    CODE=CANCELLED,
)


class CancelLost(Exception):
    """The queue has no epoch, or its epoch changed while cancel ran: Redis lost it; ``str()``
    is the one line to show."""


@dataclass(frozen=True)
class CancelReport:
    scope: int  # ids looked at: the queue's order list, the tag's set, or the ids given
    cancelled: int  # results this call wrote (the others had one already, or are unknown)
    unknown: list[str] = field(default_factory=list)  # never enqueued, or collected and forgotten
    without_entry: int = 0  # of cancelled: no stream entry was found (their rows carry no metadata)


def cancelled_result(job_id: str, payload: bytes) -> Result:
    """The cancelled Result of a job whose entry holds ``payload``: with the job's metadata,
    model and enqueue time when the payload is a valid job."""
    message = f"job {job_id!r} was cancelled (radixq cancel) before it had a result"
    finished = now_ms()
    try:
        job: Job | None = decode_job(payload) if payload else None
    except JobError:
        job = None
    if job is None or job.id != job_id:
        return error_result(job_id, CANCELLED, message, timings=Timings(finished_at_ms=finished))
    timings = Timings(enqueued_at_ms=job.enqueued_at_ms, finished_at_ms=finished)
    return error_result(
        job_id, CANCELLED, message, metadata=job.metadata, model=job.model or "", timings=timings
    )


class Canceller:
    """One cancel call on one queue whose epoch is ``epoch``; ``backoff`` retries each Redis step
    through transient errors (each step can be repeated: a scan reads, a write checks the marks)."""

    def __init__(self, client: redis.Redis, keys: QueueKeys, epoch: str, backoff: Backoff) -> None:
        self.redis = client
        self.keys = keys
        self.epoch = epoch
        self.call = backoff.call
        self.scan = StreamScan(client, keys)
        self.write_script = client.register_script(_WRITE)
        self.written = 0

    def run(self, ids: list[str] | None, tag: str | None) -> CancelReport:
        own = self.keys.cancelling(secrets.token_hex(8)) if ids is not None else None
        filter_key = own if own is not None else (self.keys.tag(tag) if tag is not None else None)
        try:
            if own is not None and ids:
                self._fill(own, ids)
            left = None if filter_key is None else self._check(ids, tag)
            for _ in range(SCANS):
                if left is not None and not left[0]:
                    break
                self._scan(filter_key, set(left[0]) if left is not None else None)
                left = self._check(ids, tag)
            assert left is not None
            remaining, unknown, scope = left
            before = self.written
            if remaining:  # NOTE: no entry found in two scans: written without the job's metadata
                self._write([(job_id.encode(), b"") for job_id in remaining])
        finally:
            if own is not None:
                self.call(partial(self.redis.delete, own))
        return CancelReport(scope, self.written, unknown, self.written - before)

    def _fill(self, filter_key: str, ids: list[str]) -> None:
        for start in range(0, len(ids), CHECK_COUNT):
            chunk = ids[start : start + CHECK_COUNT]

            def add(chunk: list[str] = chunk) -> None:
                with self.redis.pipeline(transaction=False) as pipe:
                    pipe.sadd(filter_key, *chunk)
                    pipe.expire(filter_key, CANCELLING_TTL_S)
                    pipe.execute()

            self.call(add)

    def _scope(self, ids: list[str] | None, tag: str | None) -> Iterator[list[str]]:
        """The ids in scope, CHECK_COUNT at a time."""
        if ids is not None:
            for start in range(0, len(ids), CHECK_COUNT):
                yield ids[start : start + CHECK_COUNT]
        elif tag is not None:
            cursor: Any = 0
            seen: set[bytes] = set()  # NOTE: SSCAN may return a member twice (a set that grows)
            while True:
                reply: Any = self.call(
                    partial(self.redis.sscan, self.keys.tag(tag), cursor, count=CHECK_COUNT)
                )
                cursor, members = reply
                fresh = [m for m in members if m not in seen]
                seen.update(fresh)
                if fresh:
                    yield [m.decode() for m in fresh]
                if int(cursor) == 0:
                    return
        else:
            start = 0
            while True:
                items: Any = self.call(
                    partial(self.redis.lrange, self.keys.order, start, start + CHECK_COUNT - 1)
                )
                if items:
                    yield [item.decode() for item in items]
                if len(items) < CHECK_COUNT:
                    return
                start += CHECK_COUNT

    def _check(self, ids: list[str] | None, tag: str | None) -> tuple[list[str], list[str], int]:
        """(ids in scope enqueued and without a result, those the queue has no record of, how many
        ids the scope holds)."""
        remaining: list[str] = []
        unknown: list[str] = []
        scope = 0
        for chunk in self._scope(ids, tag):
            scope += len(chunk)

            def marks(chunk: list[str] = chunk) -> Any:
                with self.redis.pipeline(transaction=False) as pipe:
                    pipe.hmget(self.keys.done, chunk)
                    pipe.hmget(self.keys.enqueued, chunk)
                    return pipe.execute()

            done, enqueued = self.call(marks)
            for job_id, mark, record in zip(chunk, done, enqueued, strict=True):
                if mark is None:
                    (remaining if record is not None else unknown).append(job_id)
        return remaining, unknown, scope

    def _scan(self, filter_key: str | None, wanted: set[str] | None) -> None:
        """Write the results of the filter's jobs found in the partition streams; with
        ``wanted``, stop once each of those ids was found."""
        partitions = self.call(lambda: read_routing(self.redis, self.keys))[0]
        for stream in self.keys.partitions(partitions):
            start = "-"
            while True:
                last, found = self.call(partial(self.scan.chunk, stream, start, filter_key))
                if found:
                    self._write([(job_id, payload) for _, job_id, payload in found])
                if wanted is not None:
                    wanted.difference_update(job_id.decode(errors="replace") for _, job_id, _ in found)
                    if not wanted:
                        return
                if not last:
                    break
                start = "(" + last

    def _write(self, rows: list[tuple[bytes, bytes]]) -> None:
        """Write the cancelled results of (id, payload) rows, WRITE_COUNT per script call."""
        keys = self.keys
        script_keys = [keys.meta, keys.results, keys.done, keys.failed, keys.enqueued, keys.cancelled]
        for start in range(0, len(rows), WRITE_COUNT):
            args: list[Any] = [self.epoch]
            for job_id, payload in rows[start : start + WRITE_COUNT]:
                text = job_id.decode(errors="replace")
                args += [job_id, encode(cancelled_result(text, payload))]
            reply: Any = self.call(partial(self.write_script, keys=script_keys, args=args, client=self.redis))
            written, current = int(reply[0]), reply[1]
            if written < 0:
                now = current.decode() if isinstance(current, bytes) else current
                raise CancelLost(
                    f"queue {keys.queue!r}: Redis lost the queue while cancel ran (its epoch {self.epoch} "
                    f"is now {now or 'gone'}); nothing more was cancelled"
                )
            self.written += written


def cancel_jobs(
    client: redis.Redis, keys: QueueKeys, backoff: Backoff, ids: list[str] | None, tag: str | None
) -> CancelReport:
    """Cancel the jobs of ``keys``' queue without a result: all of them, those of ``tag``, or
    those of ``ids`` (not both). Raises CancelLost when the queue has no epoch or Redis loses it
    meanwhile, RedisUnavailable/RedisError as Backoff does (what was cancelled stays cancelled:
    run it again)."""
    if ids is not None and tag is not None:
        raise ValueError("cancel takes ids or a tag, not both")
    epoch = backoff.call(lambda: read_epoch(client, keys))
    if epoch is None:
        raise CancelLost(
            f"queue {keys.queue!r} has no epoch: Redis lost it, or its jobs were not enqueued with radixq"
        )
    return Canceller(client, keys, epoch, backoff).run(ids, tag)


def read_ids(path: str) -> list[str]:
    """The job ids a ``cancel --ids`` file names ('-': stdin), each once in first-seen order:
    one id a line, or JSONL rows (a line starting with "{": its ``custom_id``, else ``id``);
    blank lines are skipped. ValueError naming the line that has no id."""
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    ids: dict[str, None] = {}
    with stream:
        for line_no, raw in enumerate(stream, start=1):
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"line {line_no}: not a JSON row ({exc.msg})") from None
                job_id = row.get("custom_id") or row.get("id") if isinstance(row, dict) else None
                if not isinstance(job_id, str) or not job_id:
                    raise ValueError(f"line {line_no}: a JSON row with no custom_id or id")
                line = job_id
            ids[line] = None
    return list(ids)
