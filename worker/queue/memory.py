"""InMemoryJobQueue: the JobQueue contract in one process (tests of the consumer's policy).

It keeps what Redis Streams consumer groups keep: entries in order per partition (routed as
the producer routes them, wire.routing; read as worker.queue.routing says), a pending list of
(entry -> consumer, deliveries, last touched), the done marks and error codes, results and
dead letters, heartbeats and an epoch. Time is the given clock (seconds), so a test can make
entries idle without sleeping. ``add`` and ``cancel`` play the producer; ``fail_with`` makes the next calls
raise, to exercise the consumer's error handling.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from wire.keys import ENTRY_CANCELLED
from wire.routing import DEFAULT_PREFIX_CHARS, partition_of, prefix_key, qualify, split_id
from wire.schema import CANCELLED, Job, Result, decode_result, encode, encode_job, error_result
from wire.status import Heartbeat, now_ms
from worker.queue.jobqueue import Delivery, Entry, Release, Write, entry_key, of_epoch
from worker.queue.routing import STEAL_AFTER_S, Router, Survey, beating, live_workers, read_routed, survey_of


@dataclass
class _Pending:
    consumer: str
    deliveries: int
    touched_s: float


class InMemoryJobQueue:
    """See worker.queue.jobqueue.JobQueue. One instance per consumer, sharing a ``MemoryStore``."""

    def __init__(
        self, store: MemoryStore, name: str, min_idle_s: float, steal_after_s: float = STEAL_AFTER_S
    ) -> None:
        self.store = store
        self.name = name
        self.where = "memory"
        self.min_idle_s = min_idle_s
        self.router = Router(name, steal_after_s, store.clock)

    def _check(self) -> None:
        if self.store.failure is not None:
            raise self.store.failure

    def prepare(self) -> bool:
        self._check()
        return True

    def survey(self, max_age_s: float) -> Survey:
        self._check()
        store, now = self.store, now_ms()
        lag = [
            len(entries) - delivered
            for entries, delivered in zip(store.streams, store.delivered, strict=True)
        ]
        beats: dict[str, Heartbeat | None] = dict(store.heartbeats)
        recent = beating(beats, self.name, now)
        orphaned = [0] * store.partitions
        for entry_id, held in store.pending.items():
            if held.consumer not in recent:
                orphaned[split_id(entry_id)[0]] += 1
        survey = survey_of(
            store.partitions, lag, len(store.pending), live_workers(beats, self.name, now), orphaned
        )
        return self.router.update(survey)

    def _read(self, partitions: list[int], count: int, block_s: float | None) -> list[Delivery]:
        store = self.store
        fresh: list[Entry] = []
        for partition in partitions:
            start = store.delivered[partition]
            taken = store.streams[partition][start : start + count]
            store.delivered[partition] += len(taken)
            fresh += taken
        for entry in fresh:
            store.pending[entry.entry_id] = _Pending(self.name, 1, store.clock())
        return [Delivery(entry, 1, store.epoch) for entry in fresh]

    def read(self, count: int, block_s: float | None) -> list[Delivery]:
        self._check()
        return read_routed(self.router, count, block_s, self._read, sleep=lambda _: None)

    def reclaim(self, count: int, sweep: bool) -> list[Delivery]:
        self._check()
        store, now = self.store, self.store.clock()
        taken: list[Delivery] = []
        own, survey = set(self.router.own), self.router.survey
        candidates = sorted(
            (item for item in store.pending.items() if sweep or survey.orphans_in(split_id(item[0])[0])),
            key=lambda item: split_id(item[0])[0] not in own,
        )
        for entry_id, held in candidates:
            if len(taken) == count:
                break
            if now - held.touched_s >= self.min_idle_s and entry_id in store.by_id:
                store.pending[entry_id] = _Pending(self.name, held.deliveries + 1, now)
                taken.append(Delivery(store.by_id[entry_id], held.deliveries + 1, store.epoch))
        return taken

    def completed(self, job_ids: list[str]) -> list[bool]:
        self._check()
        return [job_id in self.store.done for job_id in job_ids]

    def cancel_count(self) -> int:
        self._check()
        return self.store.cancelled

    def complete(self, writes: list[Write], acks: list[str]) -> list[Write]:
        self._check()
        store = self.store
        dropped = [w for w in writes if not of_epoch(w.completion.epoch, store.epoch)]
        for write in [w for w in writes if of_epoch(w.completion.epoch, store.epoch)]:
            completion, result = write.completion, write.completion.result
            acks = [*acks, completion.entry_id, *completion.also_ack]
            if result.id in store.done:  # NOTE: the first result written counts; this one is not kept
                continue
            store.results.append((completion.entry_id, write.data))
            store.done[result.id] = completion.entry_id
            if result.error is not None:
                store.failed[result.id] = result.error.code
            if completion.dead is not None:
                store.dead.append((result.id, completion.dead.reason, completion.dead.attempts))
        for entry_id in acks:
            store.pending.pop(entry_id, None)
        return dropped

    def renew(self, entry_ids: list[str]) -> set[str]:
        self._check()
        lost = set()
        for entry_id in entry_ids:
            held = self.store.pending.get(entry_id)
            if held is None or held.consumer != self.name:
                lost.add(entry_id)
            else:
                held.touched_s = self.store.clock()
        return lost

    def count_attempt(self, entry_id: str) -> int | None:
        self._check()
        held = self.store.pending.get(entry_id)
        if held is None or held.consumer != self.name:
            return None
        held.deliveries += 1
        held.touched_s = self.store.clock()
        return held.deliveries

    def release(self, jobs: list[Release]) -> list[Release]:
        self._check()
        dropped = [job for job in jobs if not of_epoch(job.epoch, self.store.epoch)]
        for job in [j for j in jobs if of_epoch(j.epoch, self.store.epoch)]:
            self.store.add_raw(job.job_id, job.data, partition=split_id(job.entry_ids[0])[0], key=job.key)
            for entry_id in job.entry_ids:
                self.store.pending.pop(entry_id, None)
        return dropped

    def leave(self) -> None:
        self._check()
        self.store.heartbeats.pop(self.name, None)

    def heartbeat(self, beat: Heartbeat, epoch: bool) -> str | None:
        self._check()
        self.store.heartbeats[self.name] = beat
        return self.store.epoch if epoch else None

    def newest_entry(self) -> tuple[int, int]:
        self._check()
        return max((entry_key(e[-1].entry_id) for e in self.store.streams if e), default=(0, 0))

    def housekeeping(self, trim: bool) -> list[str]:
        self._check()
        return []


class MemoryStore:
    """What the queue holds, shared by the InMemoryJobQueues of several consumers."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        partitions: int = 1,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
    ) -> None:
        self.clock = clock
        self.partitions = partitions
        self.prefix_chars = prefix_chars
        self.streams: list[list[Entry]] = [[] for _ in range(partitions)]
        self.by_id: dict[str, Entry] = {}
        self.delivered = [0] * partitions  # streams[p][:delivered[p]] were handed out
        self.pending: dict[str, _Pending] = {}
        self.done: dict[str, str] = {}
        self.failed: dict[str, str] = {}
        self.results: list[tuple[str, bytes]] = []
        self.dead: list[tuple[str, str, int]] = []
        self.heartbeats: dict[str, Heartbeat] = {}
        self.cancelled = 0  # results cancel() wrote
        self.epoch: str | None = secrets.token_hex(8)
        self.failure: Exception | None = None
        self._ids = itertools.count(1)

    def add(self, jobs: list[Job]) -> None:
        for job in jobs:
            key = prefix_key(job, self.prefix_chars)
            self.add_raw(job.id, encode_job(job), partition=partition_of(key, self.partitions), key=key)

    def add_raw(
        self, job_id: str, data: bytes, problem: str | None = None, partition: int = 0, key: str = ""
    ) -> Entry:
        entry_id = qualify(partition, f"{int(time.time() * 1000)}-{next(self._ids)}")
        entry = Entry(entry_id, job_id, data, problem, key)
        self.streams[partition].append(entry)
        self.by_id[entry.entry_id] = entry
        return entry

    def results_by_id(self) -> dict[str, list[Result]]:
        found: dict[str, list[Result]] = {}
        for _, data in self.results:
            result = decode_result(data)
            found.setdefault(result.id, []).append(result)
        return found

    def cancel(self, job_ids: list[str]) -> None:
        """What ``radixq cancel`` does (producer.cancel): a ``cancelled`` result for each job
        without one, and the counter moved."""
        for job_id in job_ids:
            if job_id not in self.done:
                self.results.append((ENTRY_CANCELLED, encode(error_result(job_id, CANCELLED, "cancelled"))))
                self.done[job_id], self.failed[job_id] = ENTRY_CANCELLED, CANCELLED
                self.cancelled += 1

    def fail_with(self, failure: Exception | None) -> None:
        """Every call of every queue on this store raises ``failure`` until it is set to None."""
        self.failure = failure

    def queue(
        self, name: str, min_idle_s: float = 60.0, steal_after_s: float = STEAL_AFTER_S
    ) -> InMemoryJobQueue:
        return InMemoryJobQueue(self, name, min_idle_s, steal_after_s)
