"""Write each job's counted result exactly once to an output JSONL file.

The results stream may hold several results for one job id (redelivery races, a dead letter
that was requeued). The one that counts is the one whose ``entry`` equals the job's field in
the ``done`` hash; the others are ignored. Output follows the given id order (enqueue order by
default); a result that arrives ahead of a missing earlier job waits in a buffer (raw bytes)
until its turn, and nothing already written stays in memory; a collect stopped early writes
those too, and the collect that completes the queue puts the file back in order
(producer.rewrite). An existing output file is
resumed: ids already in it are not written again, except dead-letter rows of jobs requeued
since (the ``requeued`` hash), which are replaced in place by the new result.

Redis trouble: transient errors are waited out (wire.retry); a queue Redis lost (epoch
gone or changed, order list shorter than seen, results written for another epoch than the
queue's) stops the collect with ``lost`` set, and such results are never written; results
trimmed (``trim``) by an earlier collect that wrote them elsewhere are reported, not awaited.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from producer.client import UnknownQueueError, queue_known
from producer.forget import forget_written, forgotten
from producer.outfile import OutputFile, result_line
from producer.progress import Progress
from producer.resume import changed_rows, done_marks, superseded_rows
from producer.rewrite import put_in_order
from wire.epoch import EpochWatch
from wire.keys import (
    DEFAULT_QUEUE,
    FIELD_ENTRY,
    FIELD_EPOCH,
    FIELD_ID,
    FIELD_RESULT,
    META_EPOCH,
    META_FORGOTTEN,
    META_RESULTS_TRIMMED,
    QueueKeys,
)
from wire.redis_errors import classify, describe, url_of
from wire.retry import Backoff, RedisUnavailable

_READ_COUNT = 2000
EntryId = tuple[int, int]


@dataclass(frozen=True)
class CollectReport:
    written: int  # lines this call appended
    already: int  # ids found in the output file before this call
    missing: list[str]  # ids in scope with no (current) row when it stopped
    failed: int = 0  # ids in scope whose row is an error row
    replaced: int = 0  # error rows of requeued jobs replaced in place by their new result
    trimmed: list[str] = field(default_factory=list)  # of missing: collected earlier, then trimmed
    lost: str | None = None  # Redis lost the queue's data while this collect ran (what it saw)
    stopped: str | None = None  # Redis unavailable past the retry timeout, or a fatal error
    duplicates: list[str] = field(default_factory=list)  # ids on several rows of the file as found
    forgotten_elsewhere: int = 0  # ids Redis forgot before this call, more than the file had rows


@dataclass
class _Pass:
    """The state of one collect call."""

    output: OutputFile
    expected: list[str]  # ids in scope, in output order
    listed: bool  # ids were given: results of other ids are not this call's
    scope: set[str]
    cursor: int = 0  # expected[:cursor] have a row (or are trimmed)
    base: int = 0  # order position of expected[0] (ids forgotten before this call: producer.forget)
    written: int = 0
    superseded: set[str] = field(default_factory=set)  # rows to replace when the new result comes
    replacements: dict[str, tuple[bytes, str | None]] = field(default_factory=dict)  # (result, digest)
    replaced: int = 0
    trimmed: set[str] = field(default_factory=set)
    lost: str | None = None  # what Redis lost, once seen
    progress: Progress | None = None

    @property
    def finished(self) -> bool:
        return self.cursor == len(self.expected) and not self.superseded


class Collector:
    """Collects one queue's results. ``say`` hears about Redis outages (default: stderr);
    ``retry_timeout_s`` bounds one outage before collect stops with ``stopped`` set."""

    def __init__(
        self,
        client: redis.Redis,
        queue: str = DEFAULT_QUEUE,
        *,
        say: Callable[[str], None] | None = None,
        retry_timeout_s: float = 60.0,
    ) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)
        self.backoff = Backoff(url_of(client), give_up_s=retry_timeout_s, say=say or _to_stderr)
        self._last_entry = "0-0"  # results stream: the last entry read
        # id -> (results entry, result, its job's digest): read, not yet due
        self._ahead: dict[str, tuple[str, bytes, str | None]] = {}
        self._watch = EpochWatch(self.keys)
        self._epoch: bytes | None = None  # the queue's epoch as of this round
        self._order_seen = 0  # the longest order list seen: a shorter one means Redis lost data
        self._trim_seen: EntryId = (0, 0)  # trimmed bound already checked for (this call)
        self._trimmed_to: EntryId = (0, 1)  # this collector trimmed the results stream below this
        self._forgotten_to = 0  # this collector forgot the ids at order positions below this

    def collect(
        self,
        out: str | Path,
        *,
        ids: list[str] | None = None,
        wait: bool = True,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        should_stop: Callable[[], bool] | None = None,
        trim: bool = False,
        progress: Progress | None = None,
    ) -> CollectReport:
        """Append the results of ``ids`` (default: every enqueued id, in order) to ``out``.

        With ``wait`` it blocks until all of them are written, ``timeout_s`` passes or
        ``should_stop()`` says so; without it, it writes what is there now and returns.
        With ``ids`` None, results of jobs that were never enqueued through a Client (written
        straight to the stream) are appended after the ordered ones. With ``trim`` the
        results stream is trimmed below the oldest entry still needed, once the rows are
        fsynced (only for the queue's one collector: others would miss what it trimmed).
        ``progress`` is told the scope and each counted result as it is read.
        Raises UnknownQueueError when Redis has no trace of the queue.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        # Each call reads the stream from its start: results an earlier call passed over
        # (other ids, another output file) may be this call's. The loss watch carries over.
        self._last_entry, self._ahead, self._trim_seen = "0-0", {}, (0, 0)
        known: list[bool] = []
        stopped = self._attempt(lambda: known.append(queue_known(self.redis, self.keys)), deadline)
        if stopped is not None:
            return CollectReport(0, 0, list(ids or []), stopped=stopped)
        if not known[0]:
            raise UnknownQueueError(self.keys.queue)
        base: list[int] = []
        stopped = self._attempt(lambda: base.append(forgotten(self.redis, self.keys)[0]), deadline)
        if stopped is not None:
            return CollectReport(0, 0, list(ids or []), stopped=stopped)
        with OutputFile(out) as output:
            scope = list(ids) if ids is not None else []
            run = _Pass(
                output, scope, listed=ids is not None, scope=set(scope), progress=progress, base=base[0]
            )
            already = len(output.ids)
            if progress is not None:
                rows = output.ids if not run.listed else output.ids & run.scope
                progress.begin(len(scope), len(rows), sum(i in output.errors for i in rows))
            stopped = self._attempt(lambda: self._load_superseded(run), deadline)
            block_ms = 0
            while stopped is None:
                stopped = self._attempt(lambda: self._round(run, block_ms, trim), deadline)  # noqa: B023
                if (
                    stopped is not None
                    or run.lost is not None
                    or run.finished
                    or not wait
                    or (deadline is not None and time.monotonic() >= deadline)
                    or (should_stop is not None and should_stop())
                ):
                    break
                block_ms = max(1, int(poll_s * 1000))
            self._write_rest(run)
            output.sync()
            if trim and stopped is None and run.lost is None:
                self._attempt(lambda: self._trim(run), deadline)
            missing = [i for i in run.expected if i not in output.ids] + sorted(run.superseded)
            failed = len(output.errors) if not run.listed else sum(i in output.errors for i in scope)
        if not run.listed and not missing and run.lost is None:
            # rows a resumed collect appended late; the rows of forgotten ids come first
            put_in_order(Path(out), run.expected, others_first=run.base > 0)
        return CollectReport(
            written=run.written,
            already=already,
            missing=missing,
            failed=failed,
            replaced=run.replaced,
            trimmed=[i for i in run.expected if i in run.trimmed and i not in output.ids],
            lost=run.lost,
            stopped=stopped,
            duplicates=output.duplicates,
            forgotten_elsewhere=max(0, run.base - already) if not run.listed else 0,
        )

    def _attempt(self, step: Callable[[], None], deadline: float | None) -> str | None:
        """Run one step through transient errors; a line saying why it stopped, or None."""
        try:
            self.backoff.call(step, deadline)
        except RedisUnavailable as exc:
            return describe(exc.cause, self.backoff.url) + (
                f" (unavailable for {exc.waited_s:.0f} s)" if exc.waited_s else ""
            )
        except redis.RedisError as exc:
            if classify(exc) == "other":
                raise
            return describe(exc, self.backoff.url)
        return None

    def _round(self, run: _Pass, block_ms: int, trim: bool) -> None:
        """Check for loss (``run.lost``), take new ids and results, write what is due, fsync,
        trim. Safe to repeat after a Redis error."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self.keys.meta, [META_EPOCH, META_RESULTS_TRIMMED, META_FORGOTTEN])
            pipe.llen(self.keys.order)
            (epoch, trimmed_raw, forgotten_raw), listed = pipe.execute()
        head = int(forgotten_raw or 0)  # order position of the list's first id
        order_len = head + listed
        self._epoch = epoch
        lost = self._watch.observe(epoch.decode() if epoch is not None else None)
        if lost is None and order_len < self._order_seen:
            lost = (
                f"queue {self.keys.queue!r}: Redis lost part of this queue (its order list went "
                f"from {self._order_seen} to {order_len} ids): it came back from an older copy"
            )
        if lost is None and epoch is None and order_len == 0 and run.output.ids and not self._order_seen:
            # NOTE: a resumed collect whose output has rows, on a queue with no epoch and no order
            # list: the results it sees now (a worker's outbox flushed after a restart) are not
            # the whole queue, and "nothing left to wait for" would be a silent loss.
            lost = (
                f"queue {self.keys.queue!r}: Redis has no epoch and no order list for this queue "
                f"although the output already holds {len(run.output.ids)} rows: it lost the queue"
            )
        if lost:
            # The watch's own advice is generic; the caller says what to do with this output.
            run.lost = lost.split(" Re-enqueue the input file")[0].rstrip(".")
            return
        self._order_seen = order_len
        if not run.listed and order_len > run.base + len(run.expected):
            start = max(0, run.base + len(run.expected) - head)
            items: Any = self.redis.lrange(self.keys.order, start, -1)
            run.expected.extend(item.decode() for item in items)
            if run.progress is not None:
                run.progress.scope(len(run.expected))
        trimmed_bound = _parse(trimmed_raw.decode()) if trimmed_raw is not None else (0, 0)
        before = self._marks_before_read(run) if trimmed_bound > self._trim_seen else None
        self._read(run, block_ms)
        if before is not None:
            self._note_trimmed(run, before)
            self._trim_seen = trimmed_bound
        if run.replacements:
            rows = {
                i: (*result_line(i, raw, digest), digest) for i, (raw, digest) in run.replacements.items()
            }
            run.replaced += run.output.replace(rows)
            run.superseded -= set(run.replacements)
            run.replacements.clear()
        run.output.sync()
        if trim:
            self._trim(run)

    def _read(self, run: _Pass, block_ms: int) -> None:
        """Read the results stream to its end, writing each chunk's due rows as it goes."""
        block: int | None = block_ms or None
        while True:
            reply: Any = self.redis.xread(
                {self.keys.results: self._last_entry}, count=_READ_COUNT, block=block
            )
            if not reply:
                return
            entries = reply[0][1]
            job_ids = [fields.get(FIELD_ID.encode(), b"").decode(errors="replace") for _, fields in entries]
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.hmget(self.keys.done, job_ids)
                pipe.hmget(self.keys.digests, job_ids)
                marks, digests = pipe.execute()
            # From here on nothing can fail: the chunk is taken whole, or (on a Redis error
            # above) not at all, and read again on the retry.
            for (entry_id, fields), job_id, mark, raw_digest in zip(
                entries, job_ids, marks, digests, strict=True
            ):
                if mark is None or mark != fields.get(FIELD_ENTRY.encode()):
                    continue  # not the result that counts
                epoch = fields.get(FIELD_EPOCH.encode())
                if epoch is not None and epoch != self._epoch:
                    run.lost = run.lost or _stale(self.keys.queue, epoch, self._epoch)
                    continue  # NOTE: written into this Redis for a queue it no longer has
                raw = fields.get(FIELD_RESULT.encode(), b"")
                digest = raw_digest.decode() if raw_digest is not None else None
                if job_id in run.superseded:
                    run.replacements[job_id] = (raw, digest)
                elif job_id in run.output.ids or job_id in self._ahead:
                    continue
                elif not run.listed or job_id in run.scope:
                    self._ahead[job_id] = (entry_id.decode(), raw, digest)
                    if run.progress is not None:
                        run.progress.result(raw)
            self._last_entry = entries[-1][0].decode()
            self._advance(run)
            if len(entries) < _READ_COUNT:
                return
            block = None

    def _advance(self, run: _Pass) -> None:
        """Write the due rows: in order, up to the first id with no result yet."""
        while run.cursor < len(run.expected):
            job_id = run.expected[run.cursor]
            if job_id not in run.output.ids and job_id not in run.trimmed:
                due = self._ahead.pop(job_id, None)
                if due is None:
                    return
                self._append(run, job_id, due[1], due[2])
            run.cursor += 1

    def _append(self, run: _Pass, job_id: str, raw: bytes, digest: str | None) -> None:
        line, code = result_line(job_id, raw, digest)
        run.output.append(job_id, line, code, digest)
        run.written += 1

    def _write_rest(self, run: _Pass) -> None:
        # Out of order from here on: what arrived behind a job that is still missing, and (ids
        # None) results of ids that were never in the order list.
        self._advance(run)
        rest = [i for i in run.expected[run.cursor :] if i in self._ahead] + list(self._ahead)
        for job_id in rest:
            due = self._ahead.pop(job_id, None)
            if due is not None:
                self._append(run, job_id, due[1], due[2])

    def _load_superseded(self, run: _Pass) -> None:
        scope = run.scope if run.listed else None
        run.superseded = superseded_rows(self.redis, self.keys, run.output.errors, scope) | changed_rows(
            self.redis, self.keys, run.output.digests, scope
        )

    def _marks_before_read(self, run: _Pass) -> dict[str, bytes]:
        waiting = [
            i
            for i in run.expected[run.cursor :]
            if i not in run.output.ids and i not in self._ahead and i not in run.trimmed
        ] + sorted(run.superseded)
        return done_marks(self.redis, self.keys, waiting)

    def _note_trimmed(self, run: _Pass, before: dict[str, bytes]) -> None:
        unseen = [
            i
            for i in before
            if (i in run.superseded and i not in run.replacements)
            or (i not in run.superseded and i not in run.output.ids and i not in self._ahead)
        ]
        now: list[Any] = self.redis.hmget(self.keys.done, unseen) if unseen else []
        for job_id, mark in zip(unseen, now, strict=True):
            if mark == before[job_id]:  # done before the read, and the read did not find it
                run.trimmed.add(job_id)
                run.superseded.discard(job_id)
        self._advance(run)

    def _trim(self, run: _Pass) -> None:
        """XTRIM MINID below the oldest entry still needed: the first buffered result, else
        the first entry not read yet; then forget the records of the ids written in order
        (producer.forget), unless rows wait to be replaced. Rows written so far are fsynced
        (the caller's duty).

        NOTE: XTRIM goes first and the bound is recorded after, in two commands: at
        maxmemory (noeviction) a MULTI holding the HSET would be refused whole, and the trim
        is what frees memory. A crash between the two leaves the record behind the trim."""
        if not run.listed and not run.superseded and run.base + run.cursor > self._forgotten_to:
            self._forgotten_to = forget_written(
                self.redis, self.keys, run.expected, run.cursor, run.base, run.output.errors
            )
        bound = min((_parse(entry) for entry, _, _ in self._ahead.values()), default=_next(self._last_entry))
        if bound <= self._trimmed_to:
            return
        text = f"{bound[0]}-{bound[1]}"
        self.redis.xtrim(self.keys.results, minid=text, approximate=False)
        recorded: Any = self.redis.hget(self.keys.meta, META_RESULTS_TRIMMED)
        if recorded is None or _parse(recorded.decode()) < bound:
            self.redis.hset(self.keys.meta, META_RESULTS_TRIMMED, text)
        self._trimmed_to = bound
        self._trim_seen = max(self._trim_seen, bound)


def _stale(queue: str, written: bytes, current: bytes | None) -> str:
    now = f"epoch {current.decode()}" if current is not None else "no epoch"
    return (
        f"queue {queue!r}: its results stream holds results of jobs read under epoch "
        f"{written.decode(errors='replace')}, and the queue has {now}: Redis lost the queue while "
        "workers held jobs (those results are not written)"
    )


def _parse(entry_id: str) -> EntryId:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _next(entry_id: str) -> EntryId:
    """The smallest entry id after ``entry_id``."""
    ms, seq = _parse(entry_id)
    return ms, seq + 1


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
