"""The Python face of a queue: enqueue jobs, read status, manage dead letters."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from producer.batch import Batch, batches, place_away
from producer.cancel import CancelReport, cancel_jobs
from producer.digest import changed_ids, changed_line, stored_digests
from producer.insert import REJECTED_ROW, Insert, Outcome
from producer.tags import check_tag, tag_ahead
from wire.cluster import together
from wire.epoch import create_epoch
from wire.keys import (
    DEFAULT_QUEUE,
    FIELD_ATTEMPTS,
    FIELD_ID,
    FIELD_JOB,
    FIELD_KEY,
    FIELD_REASON,
    META_EPOCH,
    META_PARTITIONS,
    META_PREFIX_CHARS,
    QueueKeys,
)
from wire.redis_errors import url_of
from wire.retry import Backoff, RedisUnavailable
from wire.routing import (
    DEFAULT_PARTITIONS,
    DEFAULT_PREFIX_CHARS,
    check_partitions,
    partition_of,
    prefix_key,
    read_routing,
)
from wire.schema import Job, JobError, Result, decode_job
from wire.status import QueueStatus, now_ms, read_status
from wire.streams import connect, ensure_groups


@dataclass
class EnqueueReport:
    enqueued: list[str]  # ids, when enqueue was asked to keep them (keep_ids)
    skipped: list[str]  # already enqueued earlier with the same content (idempotent by job id)
    changed: list[str] = field(default_factory=list)  # enqueued earlier with other content: kept
    rerun: list[str] = field(default_factory=list)  # changed and done: enqueued again (rerun_changed)
    jobs_enqueued: int = 0  # new jobs (not reruns, nor rows rejected before, written as their error results)
    jobs_skipped: int = 0


class EnqueueStopped(Exception):
    """Enqueue stopped before the last job: Redis stayed unavailable past the retry timeout
    (``waited_s`` > 0) or answered with an error retrying cannot fix.

    ``report`` lists what went in: every batch is one script, all or nothing (producer.insert),
    so exactly those ids are in Redis - except up to ``uncertain`` ids of a batch whose reply was
    lost with the connection (they may be in; enqueueing again skips them if they are). A
    ``cause`` that is QueueLost: Redis lost the queue while it was being enqueued.
    """

    def __init__(self, report: EnqueueReport, cause: redis.RedisError, uncertain: int, waited_s: float):
        super().__init__(str(cause))
        self.report = report
        self.cause = cause
        self.uncertain = uncertain
        self.waited_s = waited_s


class ContentChanged(ValueError):
    """Ids enqueued before with other content (``ids``), found before anything was written;
    ``str()`` is the one line to show."""

    def __init__(self, ids: list[str], since: str = "they were enqueued", then: str = "") -> None:
        super().__init__(changed_line(ids, since) + then)
        self.ids = ids
        self.report: EnqueueReport | None = None  # what was enqueued before it stopped, if anything


class UnknownQueueError(Exception):
    """Redis has no trace of the queue: no epoch, no order list, no jobs or results."""

    def __init__(self, queue: str) -> None:
        super().__init__(f"unknown queue {queue!r} (never enqueued, or Redis lost it)")
        self.queue = queue


@dataclass(frozen=True)
class DeadLetter:
    entry_id: str  # in the dead-letter stream
    job_id: str
    reason: str
    attempts: int
    job: bytes


def read_order(client: redis.Redis, keys: QueueKeys) -> list[str]:
    """Every enqueued job id, in enqueue order."""
    items: Any = client.lrange(keys.order, 0, -1)
    return [item.decode() for item in items]


def queue_known(client: redis.Redis, keys: QueueKeys) -> bool:
    """Whether Redis knows the queue: an epoch, an order list, or jobs or results in its streams.

    NOTE: an empty jobs stream does not count: a worker recreates it (with its group) after
    Redis lost everything, which must not make a lost queue look like an empty one.
    """
    with client.pipeline(transaction=False) as pipe:
        pipe.hexists(keys.meta, META_EPOCH)
        pipe.exists(keys.order)
        pipe.xlen(keys.jobs)
        pipe.xlen(keys.results)
        epoch, order, jobs, results = pipe.execute()
    return bool(epoch or order or jobs or results)


class Client:
    """A handle on one named queue.

    ``enqueue`` is idempotent by job id: a job whose id was enqueued before is skipped, so
    enqueueing the same file twice creates no duplicate work. Transient Redis errors
    (connection loss, LOADING, OOM at maxmemory, READONLY) are retried with backoff for up to
    ``retry_timeout_s`` without progress; ``say`` hears about each outage once.

    ``partitions`` and ``prefix_chars`` set the queue's routing (wire.routing) when this
    client enqueues first; a queue keeps the routing its first enqueue gave it.
    """

    def __init__(
        self,
        client: redis.Redis,
        queue: str = DEFAULT_QUEUE,
        *,
        retry_timeout_s: float = 60.0,
        say: Callable[[str], None] | None = None,
        partitions: int = DEFAULT_PARTITIONS,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)
        self.wanted_routing = (check_partitions(partitions), prefix_chars)
        self.routing = (1, prefix_chars)  # the queue's, once known (_prepare)
        self.backoff = Backoff(url_of(client), give_up_s=retry_timeout_s, say=say)
        self.insert = Insert(client, self.keys)
        self.epoch = ""  # the queue's, once known (_prepare): every batch is written under it
        # a batch's fates are kept past the longest its retries can take (producer.insert)
        self.keep_batch_ms = int((retry_timeout_s + 60) * 1000)
        self.uncertain = 0  # rows of the batch whose script reply was lost, until a retry answers

    @classmethod
    def from_url(cls, url: str, queue: str = DEFAULT_QUEUE, **options: Any) -> Client:
        return cls(connect(url), queue, **options)

    def close(self) -> None:
        self.redis.close()

    def enqueue(
        self,
        jobs: Iterable[Job | Result],
        batch_size: int = 1000,
        *,
        rerun_changed: bool = False,
        refuse_changed: bool = False,
        stop_on_changed: bool = False,
        keep_ids: bool = True,
        tag: str | None = None,
    ) -> EnqueueReport:
        """Add the jobs whose ids are new, in batches of one script each (producer.insert: all
        or nothing; a batch of large jobs is cut at MAX_BATCH_BYTES), taking one batch at a time
        from ``jobs`` (an iterator is read as it goes: memory holds one batch, unless
        ``refuse_changed`` asks for the check below, which reads them all first).

        A Result in ``jobs`` is a row rejected before it could be a job (an ``invalid_job``
        error): it takes its place in the enqueue order with its result already written, so
        collect writes its error row where the row was in the input. ``keep_ids`` False: the
        report counts, it lists no enqueued or skipped ids (for inputs of any size).

        An id enqueued before with other content (producer.digest) is ``changed``: kept as it
        was, unless ``rerun_changed`` and its job is done, then it is enqueued again with the
        new content (``rerun``: its result stops counting, so collect waits for the new one
        and replaces its row). With ``refuse_changed`` (and not ``rerun_changed``) such ids
        raise ContentChanged before anything is written; with ``stop_on_changed`` (an input that
        can be read once only: a pipe) before the batch holding them is written, the report of
        the batches written before it on the exception (``report``).

        ``tag`` (producer.tags: a batch id, say) is given to each job before it goes in, so
        ``cancel(tag=...)`` finds them; a job keeps the first tag it was enqueued with.

        Raises EnqueueStopped (carrying the partial report) when Redis stays unavailable
        longer than the retry timeout or answers with another error.
        """
        if tag is not None:
            check_tag(tag)
        report = EnqueueReport([], [])
        self.uncertain = 0
        try:
            if refuse_changed and not rerun_changed:
                jobs = list(jobs)
                known = self.backoff.call(lambda: stored_digests(self.redis, self.keys, [j.id for j in jobs]))
                changed = changed_ids(jobs, known)
                if changed:
                    raise ContentChanged(changed)
            self.backoff.call(self._prepare)
            if tag is not None:
                jobs = tag_ahead(self.redis, self.keys, jobs, tag, batch_size, self.backoff.call)
            batch: list[Job | Result] = []
            for job in jobs:
                batch.append(job)
                if len(batch) == batch_size:
                    self._enqueue_batch(batch, report, rerun_changed, keep_ids, stop_on_changed)
                    batch = []
            if batch:
                self._enqueue_batch(batch, report, rerun_changed, keep_ids, stop_on_changed)
        except ContentChanged as exc:
            exc.report = report
            raise
        except RedisUnavailable as exc:
            raise EnqueueStopped(report, exc.cause, self.uncertain, exc.waited_s) from exc
        except redis.RedisError as exc:
            raise EnqueueStopped(report, exc, self.uncertain, 0.0) from exc
        return report

    def cancel(self, ids: Iterable[str] | None = None, *, tag: str | None = None) -> CancelReport:
        """Give every job without a result a ``cancelled`` error result, exactly once: all the
        queue's jobs, those of ``ids``, or those enqueued with ``tag`` (producer.cancel). Jobs
        that have a result keep it; workers run none of the cancelled jobs from then on and
        abort those they hold. Idempotent. Raises UnknownQueueError, CancelLost (Redis lost
        the queue), and RedisUnavailable/RedisError (run it again: nothing is cancelled twice)."""
        if not self.backoff.call(self.known):
            raise UnknownQueueError(self.keys.queue)
        return cancel_jobs(self.redis, self.keys, self.backoff, list(ids) if ids is not None else None, tag)

    def find_changed(self, jobs: Iterable[Job | Result], batch_size: int = 10_000) -> list[str]:
        """Ids of ``jobs`` enqueued before with other content (producer.digest), read batch by
        batch as ``jobs`` yields them; writes nothing. What ``refuse_changed`` checks, for an
        input too large to hold."""
        changed: list[str] = []
        batch: list[Job | Result] = []

        def check() -> None:
            known = self.backoff.call(lambda: stored_digests(self.redis, self.keys, [j.id for j in batch]))
            changed.extend(changed_ids(batch, known))
            batch.clear()

        try:
            for job in jobs:
                batch.append(job)
                if len(batch) == batch_size:
                    check()
            if batch:
                check()
        except RedisUnavailable as exc:
            raise EnqueueStopped(EnqueueReport([], []), exc.cause, 0, exc.waited_s) from exc
        except redis.RedisError as exc:
            raise EnqueueStopped(EnqueueReport([], []), exc, 0, 0.0) from exc
        return changed

    def knows_any(self, ids: Iterable[str], batch_size: int = 10_000) -> bool:
        """Whether the queue holds a digest (producer.digest) for any of ``ids``, read batch by
        batch as they come (stopping at the first batch that has one); writes nothing."""
        batch: list[str] = []

        def known() -> bool:
            found = self.backoff.call(lambda: stored_digests(self.redis, self.keys, batch))
            batch.clear()
            return bool(found)

        try:
            for job_id in ids:
                batch.append(job_id)
                if len(batch) == batch_size and known():
                    return True
            return bool(batch) and known()
        except RedisUnavailable as exc:
            raise EnqueueStopped(EnqueueReport([], []), exc.cause, 0, exc.waited_s) from exc
        except redis.RedisError as exc:
            raise EnqueueStopped(EnqueueReport([], []), exc, 0, 0.0) from exc

    def _prepare(self) -> None:
        self.epoch = create_epoch(self.redis, self.keys)
        partitions, chars = self.wanted_routing
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hsetnx(self.keys.meta, META_PARTITIONS, partitions)
            pipe.hsetnx(self.keys.meta, META_PREFIX_CHARS, chars)
            pipe.execute()
        self.routing = read_routing(self.redis, self.keys)
        ensure_groups(self.redis, self.keys, self.routing[0])

    def _fields(self, job: Job, data: bytes, atomic: bool = False) -> tuple[str, dict[Any, Any]]:
        """The partition stream of a job and its entry's fields. ``atomic``: a stream one MULTI
        with the queue's other keys may write (on a cluster, partition 0 for a job whose own
        partition has another slot: the job still runs, away from its prefix's owner)."""
        partitions, chars = self.routing
        key = prefix_key(job, chars)
        stream = self.keys.partition(partition_of(key, partitions))
        if atomic and not together(self.redis, [stream, self.keys.enqueued]):
            stream = self.keys.jobs
        return stream, {FIELD_ID: job.id, FIELD_JOB: data, FIELD_KEY: key}

    def _enqueue_batch(
        self,
        jobs: list[Job | Result],
        report: EnqueueReport,
        rerun_changed: bool,
        keep_ids: bool,
        stop_on_changed: bool = False,
    ) -> None:
        """One batch of ``enqueue``: its rows made once (producer.batch), then written by the
        insert script (producer.insert), all or nothing, with no WATCH: producers enqueueing at
        once never make each other retry. Each script call has a token of its own, so a retry
        after a lost reply learns what the first try did."""
        for batch in batches(self.redis, self.keys, self.routing, jobs, now_ms()):
            token = secrets.token_hex(8)
            enqueued_at_ms = now_ms()

            def attempt(batch: Batch = batch, token: str = token, at_ms: int = enqueued_at_ms) -> Outcome:
                rows = place_away(self.redis, self.keys, batch)
                try:
                    return self.insert(
                        self.epoch, token, rows, batch.streams, at_ms,
                        keep_ms=self.keep_batch_ms, rerun_changed=rerun_changed, stop_on_changed=stop_on_changed,
                    )  # fmt: skip
                except (redis.ConnectionError, redis.TimeoutError):
                    self.uncertain = len(rows)
                    raise

            outcome = self.backoff.call(attempt)
            self.uncertain = 0
            if not outcome.written:
                raise ContentChanged(
                    [row.id for row, fate in zip(batch.rows, outcome.fates, strict=True) if fate == "changed"]
                )
            for row, fate in zip(batch.rows, outcome.fates, strict=True):
                if fate in ("changed", "rerun") or keep_ids:
                    getattr(report, fate).append(row.id)
                if row.where != REJECTED_ROW:
                    report.jobs_enqueued += fate == "enqueued"
                    report.jobs_skipped += fate == "skipped"

    def order(self) -> list[str]:
        """All job ids in enqueue order."""
        return read_order(self.redis, self.keys)

    def known(self) -> bool:
        return queue_known(self.redis, self.keys)

    def status(self) -> QueueStatus:
        """A snapshot of the queue; raises UnknownQueueError when Redis has no trace of it."""
        if not self.known():
            raise UnknownQueueError(self.keys.queue)
        return read_status(self.redis, self.keys)

    def dead_letters(self, count: int = 1000) -> list[DeadLetter]:
        entries: Any = self.redis.xrange(self.keys.dead, count=count)
        return [
            DeadLetter(
                entry_id=entry_id.decode(),
                job_id=fields[FIELD_ID.encode()].decode(errors="replace"),
                reason=fields.get(FIELD_REASON.encode(), b"").decode(errors="replace"),
                attempts=int(fields.get(FIELD_ATTEMPTS.encode(), b"0")),
                job=fields[FIELD_JOB.encode()],
            )
            for entry_id, fields in entries
        ]

    def requeue_dead(self, job_ids: Iterable[str] | None = None) -> list[str]:
        """Put dead letters back on the jobs stream (all, or those with the given ids).

        Each one gets a fresh delivery count; its dead_letter result stops counting (the
        ``done`` mark is removed), so collect waits for the new run's result, and the job's
        count in the ``requeued`` hash goes up, so a resumed collect replaces its dead-letter
        row. Returns the ids requeued (ids with no dead letter are not in it).
        """
        wanted = set(job_ids) if job_ids is not None else None
        self.backoff.call(self._prepare)
        letters = self.backoff.call(lambda: self.dead_letters(count=1 << 30))
        return [
            letter.job_id
            for letter in letters
            if (wanted is None or letter.job_id in wanted) and self._requeue_one(letter)
        ]

    def discard_dead(self, entry_ids: Iterable[str]) -> int:
        """Remove dead letters (by their entry ids) for good: their jobs keep the ``dead_letter``
        error result they have (collect writes it as their row). Returns how many were removed."""
        ids = list(entry_ids)
        if not ids:
            return 0
        return int(self.backoff.call(lambda: self.redis.xdel(self.keys.dead, *ids)))

    def _letter_fields(self, letter: DeadLetter) -> tuple[str, dict[Any, Any]]:
        try:
            return self._fields(decode_job(letter.job), letter.job, atomic=True)
        except JobError:  # it gets its error again, from partition 0
            return self.keys.jobs, {FIELD_ID: letter.job_id, FIELD_JOB: letter.job}

    def _requeue_one(self, letter: DeadLetter) -> bool:
        # The dead-letter entry leaves in the same transaction that requeues the job, so a
        # retry after a lost EXEC reply finds it gone and does not requeue the job twice.
        keys = self.keys
        tried = False

        def attempt() -> bool:
            nonlocal tried
            with self.redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(keys.dead)
                        if not pipe.xrange(keys.dead, letter.entry_id, letter.entry_id):
                            return tried
                        pipe.multi()
                        stream, fields = self._letter_fields(letter)
                        pipe.xadd(stream, fields)
                        pipe.hdel(keys.done, letter.job_id)
                        pipe.hdel(keys.failed, letter.job_id)
                        pipe.hincrby(keys.requeued, letter.job_id, 1)
                        pipe.xdel(keys.dead, letter.entry_id)
                        tried = True
                        pipe.execute()
                        return True
                    except redis.WatchError:
                        tried = False
                        continue

        return self.backoff.call(attempt)
