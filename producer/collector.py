"""Write each job's counted result exactly once to an output JSONL file, in input order.

The results stream may hold several results for one job id (redelivery races, a dead letter
that was requeued). The one that counts is the one whose ``entry`` equals the job's field in
the ``done`` hash; the others are ignored. Every counted result read goes to the spill
(producer.spill: SQLite beside the output) and, with ``trim``, leaves Redis as soon as the spill
has it, whatever order the workers finish in: Redis holds only results not read yet. The
output file is appended from the spill in the given id order (enqueue order by default), up to
the first id with no result yet; a collect that stops early leaves what arrived behind that id
in the spill, and the next collect into the same output writes it in its turn (``flush_rest``:
appended out of order instead, for ``run``, which puts the file in order at the end). An
existing output file is resumed: ids already in it are not written again, except dead-letter
rows of jobs requeued since (the ``requeued`` hash) and rows of jobs enqueued again with other
content, which are replaced in place by the new result.

Redis trouble: transient errors are waited out (wire.retry), from the first call on (a Redis
still starting, or restarting, is waited for); a queue Redis lost (epoch gone or changed, order
list shorter than seen, results written for another epoch than the queue's) stops the collect
with ``lost`` set, and such results are never written; results trimmed (``trim``) by an earlier
collect that wrote them elsewhere are reported, not awaited.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from producer.client import UnknownQueueError, queue_known
from producer.collect_pass import CollectPass, CollectReport, WaitFor
from producer.consumers import ConsumerWatch
from producer.forget import forgotten
from producer.outfile import OutputFile
from producer.progress import Progress
from producer.resume import changed_rows, done_marks, superseded_rows
from producer.spill import Spill, spill_path
from producer.trim import Trimmer
from wire.enqueues import enqueues_finished
from wire.epoch import EpochWatch
from wire.keys import (
    DEFAULT_QUEUE,
    FIELD_ID,
    META_ENQUEUES_FINISHED,
    META_EPOCH,
    META_FORGOTTEN,
    META_RESULTS_TRIMMED,
    QueueKeys,
)
from wire.redis_errors import classify, describe, url_of
from wire.retry import Backoff, RedisUnavailable

__all__ = ["CollectReport", "Collector", "WaitFor"]

_READ_COUNT = 1000  # results per XREAD: each chunk is spilled, then trimmed from Redis
EntryId = tuple[int, int]


class Collector:
    """Collects one queue's results. ``say`` hears about Redis outages and a queue nothing
    consumes (default: stderr); ``retry_timeout_s`` bounds one outage before collect stops with
    ``stopped`` set."""

    def __init__(
        self,
        client: redis.Redis,
        queue: str = DEFAULT_QUEUE,
        *,
        say: Callable[[str], None] | None = None,
        retry_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)
        self.say = say or _to_stderr
        self.clock = clock
        self.backoff = Backoff(url_of(client), give_up_s=retry_timeout_s, say=self.say)
        # NOTE: "connection refused" before Redis ever answered is an outage to wait out too:
        # a collect started while its Redis (re)starts
        self.backoff.reached = True
        self._last_entry = "0-0"  # results stream: the last entry read
        self._watch = EpochWatch(self.keys)
        self._epoch: bytes | None = None  # the queue's epoch as of this round
        self._order_seen = 0  # the longest order list seen: a shorter one means Redis lost data
        self._trim_seen: EntryId = (0, 0)  # trimmed bound already checked for (this call)
        self.trimmer = Trimmer(client, self.keys)

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
        until: WaitFor | None = None,
        watch_consumers: bool = False,
        flush_rest: bool = False,
    ) -> CollectReport:
        """Append the results of ``ids`` (default: every enqueued id, in order) to ``out``.

        With ``wait`` it blocks until all of them are written (and what ``until`` asks for has
        come), ``timeout_s`` passes or ``should_stop()`` says so (checked between rounds and
        while Redis is away); without it, it writes what is there now and returns. With ``ids``
        None, results of jobs that were never enqueued through a Client (written straight to
        the stream) are appended after the ordered ones. With ``trim`` each result read is
        trimmed from the results stream once the spill has it, and the records of the ids
        written in order are forgotten (only for the queue's one collector: others would miss
        what it trimmed). ``progress`` is told the scope and each counted result as it is read.
        ``watch_consumers``: say once when no worker consumes the queue (producer.consumers).
        ``flush_rest``: at the end, append what waits in the spill, out of order (``run``).
        Raises UnknownQueueError when Redis has no trace of the queue (with ``until`` expecting
        jobs, a queue not enqueued to yet is waited for).
        """
        deadline = None if timeout_s is None else self.clock() + timeout_s
        until = until or WaitFor()
        stop = should_stop or (lambda: False)
        self.backoff.stop = stop
        # Each call reads the stream from its start: results an earlier call passed over
        # (other ids, another output file) may be this call's. The loss watch carries over.
        self._last_entry, self._trim_seen = "0-0", (0, 0)
        try:
            try:
                stopped = self._await_queue(
                    wait and (until.jobs > 0 or until.enqueues > 0), deadline, poll_s, stop
                )
            except _NeverEnqueued:
                return CollectReport(0, 0, [], short=until.short(0, 0))
            base: list[int] = []
            if stopped is None:
                stopped = self._attempt(lambda: base.append(forgotten(self.redis, self.keys)[0]), deadline)
            if stopped is not None:
                return CollectReport(0, 0, list(ids or []), stopped=stopped)
            with OutputFile(out) as output, Spill(spill_path(out)) as spill:
                run = CollectPass(output, spill, list(ids or []), ids is not None, self.clock, progress)
                run.base = base[0]
                watch = (
                    ConsumerWatch(self.redis, self.keys, self.say, self.clock) if watch_consumers else None
                )
                stopped = self._rounds(run, wait, deadline, poll_s, stop, trim, until, watch)
                run.finish(out_of_order=flush_rest)
                if trim and stopped is None and run.lost is None:
                    self._attempt(lambda: self._forget(run), deadline)
                return run.report(stopped, until)
        finally:
            self.backoff.stop = None

    def _await_queue(
        self, coming: bool, deadline: float | None, poll_s: float, stop: Callable[[], bool]
    ) -> str | None:
        """Wait until Redis knows the queue (``coming``: producers may not have begun; else it
        must know it now: UnknownQueueError). A line saying why it stopped, or None;
        _NeverEnqueued when told to stop (or timed out) before the queue existed."""
        while True:
            known: list[bool] = []
            stopped = self._attempt(lambda: known.append(queue_known(self.redis, self.keys)), deadline)  # noqa: B023
            if stopped is not None or known[0]:
                return stopped
            if not coming:
                raise UnknownQueueError(self.keys.queue)
            if (deadline is not None and self.clock() >= deadline) or stop():
                raise _NeverEnqueued
            time.sleep(poll_s)

    def _rounds(
        self,
        run: CollectPass,
        wait: bool,
        deadline: float | None,
        poll_s: float,
        stop: Callable[[], bool],
        trim: bool,
        until: WaitFor,
        watch: ConsumerWatch | None,
    ) -> str | None:
        """Collect round after round until done or told to stop; why it stopped early (Redis
        unavailable, a fatal error), or None."""
        stopped = self._attempt(lambda: self._load_superseded(run), deadline)
        block_ms = 0
        while stopped is None:
            stopped = self._attempt(lambda: self._round(run, block_ms, trim, until), deadline)  # noqa: B023
            if (
                stopped is not None
                or run.lost is not None
                or (run.caught_up and run.waited(until))
                or not wait
                or (deadline is not None and self.clock() >= deadline)
                or stop()
            ):
                break
            if watch is not None and not run.caught_up:
                watch.check()
            block_ms = max(1, int(poll_s * 1000))
        return stopped

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

    def _round(self, run: CollectPass, block_ms: int, trim: bool, until: WaitFor) -> None:
        """Check for loss (``run.lost``), take new ids and results (spilled, trimmed, written
        when due), replace superseded rows, forget what was written. Safe to repeat after a
        Redis error."""
        with self.redis.pipeline(transaction=True) as pipe:
            fields = [META_EPOCH, META_RESULTS_TRIMMED, META_FORGOTTEN, META_ENQUEUES_FINISHED]
            pipe.hmget(self.keys.meta, fields)
            pipe.llen(self.keys.order)
            (epoch, trimmed_raw, forgotten_raw, finished_raw), listed = pipe.execute()
        head = int(forgotten_raw or 0)  # order position of the list's first id
        order_len = head + listed
        self._epoch = epoch
        run.lost = self._loss(run, epoch, order_len)
        if run.lost is not None:
            return
        self._order_seen = order_len
        if order_len > run.order_len:
            run.changed_at = self.clock()
        run.order_len, run.enqueues = order_len, enqueues_finished(finished_raw)
        if not run.listed and order_len > run.base + len(run.expected):
            start = max(0, run.base + len(run.expected) - head)
            items: Any = self.redis.lrange(self.keys.order, start, -1)
            run.expected.extend(item.decode() for item in items)
        if run.progress is not None and not run.listed:
            run.progress.scope(max(len(run.expected), until.jobs - run.base))
        trimmed_bound = _parse(trimmed_raw.decode()) if trimmed_raw is not None else (0, 0)
        before = self._marks_before_read(run) if trimmed_bound > self._trim_seen else None
        self._read(run, block_ms, trim)
        if before is not None:
            self._note_trimmed(run, before)
            self._trim_seen = trimmed_bound
        run.replace()
        run.advance()
        if trim:
            self._forget(run)

    def _loss(self, run: CollectPass, epoch: bytes | None, order_len: int) -> str | None:
        """What Redis lost of the queue since this collector first saw it, as one line, or None."""
        if run.lost is not None:
            return run.lost
        lost = self._watch.observe(epoch.decode() if epoch is not None else None)
        if lost is None and order_len < self._order_seen:
            lost = (
                f"queue {self.keys.queue!r}: Redis lost part of this queue (its order list went "
                f"from {self._order_seen} to {order_len} ids): it came back from an older copy"
            )
        rows = len(run.output.ids) + len(run.spill.ids)
        if lost is None and epoch is None and order_len == 0 and rows and not self._order_seen:
            # NOTE: a resumed collect whose output has rows, on a queue with no epoch and no order
            # list: the results it sees now (a worker's outbox flushed after a restart) are not
            # the whole queue, and "nothing left to wait for" would be a silent loss.
            lost = (
                f"queue {self.keys.queue!r}: Redis has no epoch and no order list for this queue "
                f"although the output already holds {rows} rows: it lost the queue"
            )
        # The watch's own advice is generic; the caller says what to do with this output.
        return lost.split(" Re-enqueue the input file")[0].rstrip(".") if lost else None

    def _forget(self, run: CollectPass) -> None:
        """Forget the records of the ids written in order (producer.forget): only with every id
        of the queue in scope, no row waiting to be replaced, and the file in order up to them."""
        allowed = not run.listed and not run.superseded and run.ordered()
        self.trimmer.forget(run.expected, run.cursor, run.base, run.output.errors, allowed=allowed)

    def _read(self, run: CollectPass, block_ms: int, trim: bool) -> None:
        """Read the results stream to its end: each chunk's counted results go to the spill
        (committed), are trimmed from Redis, and the rows now due are written."""
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
            # From here on no Redis call until the spill has the chunk: it is taken whole, or (on
            # a Redis error above) not at all, and read again on the retry.
            run.spill.put(run.counted(entries, job_ids, marks, digests, self._epoch, self._stale))
            run.spill.commit()
            self._last_entry = entries[-1][0].decode()
            if trim:
                self._trim_seen = max(self._trim_seen, self.trimmer.trim_to(_next(self._last_entry)))
            run.advance()
            if len(entries) < _READ_COUNT:
                return
            block = None

    def _stale(self, written: bytes) -> str:
        return _stale(self.keys.queue, written, self._epoch)

    def _load_superseded(self, run: CollectPass) -> None:
        scope = run.scope if run.listed else None
        run.superseded = superseded_rows(self.redis, self.keys, run.output.errors, scope) | changed_rows(
            self.redis, self.keys, run.output.digests, scope
        )

    def _marks_before_read(self, run: CollectPass) -> dict[str, bytes]:
        waiting = [
            i
            for i in run.expected[run.cursor :]
            if i not in run.output.ids and i not in run.spill.ids and i not in run.trimmed
        ] + sorted(run.superseded - run.replacing)
        return done_marks(self.redis, self.keys, waiting)

    def _note_trimmed(self, run: CollectPass, before: dict[str, bytes]) -> None:
        """Ids done before the read whose result the read did not find: trimmed by an earlier
        collect into another output (reported, never waited for)."""
        unseen = [
            i
            for i in before
            if (i in run.superseded and i not in run.replacing)
            or (i not in run.superseded and i not in run.output.ids and i not in run.spill.ids)
        ]
        now: list[Any] = self.redis.hmget(self.keys.done, unseen) if unseen else []
        for job_id, mark in zip(unseen, now, strict=True):
            if mark == before[job_id]:
                run.trimmed.add(job_id)
                run.superseded.discard(job_id)
        run.advance()


class _NeverEnqueued(Exception):
    """A collect waiting for producers stopped before the queue existed."""


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
