"""The queue as a worker sees it: the seam between the consumer's policy and Redis.

The Consumer decides what to read and when, what to renew, what to dead-letter and what to
give back; a JobQueue carries that out. Two implementations:
worker.queue.streams.RedisJobQueue (Redis Streams: what workers run on) and
worker.queue.memory.InMemoryJobQueue (in one process: tests of the policy, embedding).

Errors: an implementation raises QueueUnavailable (nothing was done; try again later),
QueueLost (the queue's state is gone: its consumer group no longer exists), QueueRefused
(retrying cannot help: a wrong password, an ACL denial; ``str()`` is the one line to show),
or anything else for a bug. ``complete`` and ``release`` are all or nothing.

Epochs: each delivery carries the queue's epoch as read with it (wire.epoch; None: the
queue has none). A completion or release of a job read under one epoch is not written once
the queue has another one, or none: Redis lost the queue since (restarted empty, then maybe
enqueued again), and the result or job would land in a queue that never had it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from wire.keys import FIELD_JOB
from wire.routing import split_id
from wire.schema import Job, JobError, Result, decode_job
from wire.status import Heartbeat
from worker.queue.routing import Survey


class QueueUnavailable(Exception):
    """The queue cannot be reached or written now (connection lost, OOM, LOADING, READONLY)."""


class QueueLost(Exception):
    """The queue's state is gone (its consumer group does not exist any more)."""


class QueueRefused(Exception):
    """The queue refuses this worker for good (credentials, permissions, TLS); one line."""


@dataclass(frozen=True)
class Entry:
    """One delivered entry. ``job_id`` is always printable text, so the entry can be answered and
    acknowledged whatever it holds; ``problem`` says why its id cannot be trusted."""

    entry_id: str  # qualified by its partition (wire.routing)
    job_id: str
    data: bytes  # the encoded job, b"" when missing
    problem: str | None = None
    key: str = ""  # the job's prefix key ("" when the entry has none)


@dataclass(frozen=True)
class Delivery:
    entry: Entry
    deliveries: int  # times the queue has handed this entry out, this time included
    epoch: str | None = None  # the queue's epoch when it was read (None: it had none)


@dataclass(frozen=True)
class DeadLetter:
    job: bytes
    reason: str
    attempts: int


@dataclass(frozen=True)
class Completion:
    result: Result
    entry_id: str  # the entry this result answers
    also_ack: tuple[str, ...] = ()  # further entries of the same job id (duplicates)
    dead: DeadLetter | None = None
    epoch: str | None = None  # of the delivery it answers: written only while the queue has it


@dataclass(frozen=True)
class Write:
    """A completion with its result already encoded (worker.queue.outbox does that)."""

    completion: Completion
    data: bytes


@dataclass(frozen=True)
class Release:
    """A job given back unfinished: put back as a new entry of the same partition (the first
    entry's) with the same prefix key, its entries acknowledged."""

    job_id: str
    data: bytes
    entry_ids: tuple[str, ...]
    key: str = ""
    epoch: str | None = None  # of its delivery: given back only while the queue has it


def decode_entry(entry: Entry) -> Job:
    """The entry's job; JobError when the entry, its payload or the job is not valid."""
    if entry.problem is not None:
        raise JobError("id", None, entry.problem)
    if not entry.data:
        why = f"the stream entry {entry.entry_id} holds no job (its {FIELD_JOB!r} field is missing or empty)"
        raise JobError("job", None, why, entry.job_id)
    job = decode_job(entry.data)
    if job.id != entry.job_id:
        raise JobError(
            "id", job.id, f"differs from the stream entry's id field {entry.job_id!r}", entry.job_id
        )
    return job


class JobQueue(Protocol):
    """What a consumer named ``name`` asks of the queue.

    - ``prepare()``: make the queue readable by this consumer (its consumer groups); False
      while another consumer of the pool does it (ask again soon).
    - ``survey(max_age_s)``: the queue's backlog, live workers and partition owners
      (worker.queue.routing.Survey), taken within ``max_age_s`` by this consumer or another
      of its pool; None when there is none yet (another consumer is taking it: ask again
      soon). It also decides which partitions this consumer owns, for ``read``.
    - ``read(count, block_s)``: up to ``count`` entries never delivered before, from this
      consumer's own partitions, else stolen from one other partition (worker.queue.routing),
      waiting up to ``block_s`` for the first (None: do not wait); they are now held by this
      consumer.
    - ``reclaim(count, sweep)``: up to ``count`` entries held by consumers that stopped
      renewing them (idle longer than the queue's min-idle time), own partitions first; their
      delivery count goes up by one. It looks in the partitions where the last survey saw
      entries held by consumers whose heartbeat stopped, or, with ``sweep``, in every one.
    - ``completed(job_ids)``: which of these jobs already have a result that counts.
    - ``cancel_count()``: how many results ``radixq cancel`` has written to the queue
      (producer.cancel); when it moves, the consumer looks for held jobs that are done.
    - ``complete(writes, acks)``: for each write of a job not done yet, its result, the job's
      done mark, its error code and its dead letter if any (the first write of a job counts: a
      job already done gets none of these again), and for every write the acknowledgement of
      its entries; plus ``acks`` (entries of jobs already done). All or nothing. Returns the
      writes it dropped: those of another epoch than the queue's now (see Epochs).
    - ``renew(entry_ids)``: keep held entries from being reclaimed; returns those no longer
      held by this consumer.
    - ``count_attempt(entry_id)``: count one more delivery of a held entry (a job that crashed
      the engine); its delivery count, or None if it is no longer held by this consumer.
    - ``release(jobs)``: give unfinished jobs back to every worker at once. All or nothing;
      returns the jobs it dropped, of another epoch than the queue's now.
    - ``leave()``: forget this consumer if it holds nothing, and its heartbeat.
    - ``heartbeat(beat, epoch)``: publish the heartbeat; with ``epoch``, returns the queue's
      epoch too (None: it has none; without ``epoch``: None).
    - ``newest_entry()``: the id of the newest entry ever added ((0, 0) when none).
    - ``housekeeping(trim)``: trim acknowledged entries (``trim``) and forget consumers that
      died holding nothing; returns the names forgotten.
    """

    name: str
    where: str  # for messages: the queue's address, no secrets

    def prepare(self) -> bool: ...

    def survey(self, max_age_s: float) -> Survey | None: ...

    def read(self, count: int, block_s: float | None) -> list[Delivery]: ...

    def reclaim(self, count: int, sweep: bool) -> list[Delivery]: ...

    def completed(self, job_ids: list[str]) -> list[bool]: ...

    def cancel_count(self) -> int: ...

    def complete(self, writes: list[Write], acks: list[str]) -> list[Write]: ...

    def renew(self, entry_ids: list[str]) -> set[str]: ...

    def count_attempt(self, entry_id: str) -> int | None: ...

    def release(self, jobs: list[Release]) -> list[Release]: ...

    def leave(self) -> None: ...

    def heartbeat(self, beat: Heartbeat, epoch: bool) -> str | None: ...

    def newest_entry(self) -> tuple[int, int]: ...

    def housekeeping(self, trim: bool) -> list[str]: ...


def of_epoch(epoch: str | None, current: str | None) -> bool:
    """Whether something read under ``epoch`` belongs to the queue whose epoch is ``current``
    (a delivery read before the queue had an epoch belongs to it whatever came since)."""
    return epoch is None or epoch == current


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id (of any partition) as a comparable (ms, seq)."""
    ms, _, seq = split_id(entry_id)[1].partition("-")
    return int(ms), int(seq or 0)
