"""The queue consumer: Redis Streams in, a GenerationBackend in the middle, results out.

One thread runs the loop. Each step: take finished results, renew leases on held entries,
write results (result + done mark + ack in one transaction), heartbeat, settle jobs that
crashed the engine, then, only once every result is written, reclaim entries of dead consumers
and read new entries - never more than the backend has room for, so a worker does not hoard
jobs another worker could run. Every few seconds it trims acknowledged entries and forgets
consumers that died holding nothing.

Failure belongs to the job: anything that goes wrong with one stream entry becomes that
entry's error result, and a job that crashes the engine alone collects attempts until it is
dead-lettered. A failed step is judged by worker.queue.guard (a transient Redis error pauses
the loop while held jobs keep running and their results wait in the outbox); worker.queue.watch
reports a Redis that lost the queue's data.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import redis

from producer.client import ensure_group
from producer.keys import FIELD_ID, FIELD_JOB, QueueKeys
from producer.redis_errors import url_of
from producer.schema import Job, JobError, Result, Timings, error_result
from producer.status import Heartbeat, now_ms
from worker.queue.backend import ENGINE_CRASH, BackendUnavailable, GenerationBackend
from worker.queue.config import ConsumerConfig
from worker.queue.entries import Entry, decode_entry, read_entry
from worker.queue.guard import Guard
from worker.queue.outbox import Completion, DeadLetter, Outbox
from worker.queue.reclaimer import Reclaimer
from worker.queue.retention import ConsumerJanitor, trim_acked_jobs
from worker.queue.watch import QueueWatch

log = logging.getLogger("radixq.worker")


@dataclass
class _Held:
    """A job the backend is running, and the stream entries it answers."""

    job: Job
    entry_id: str
    data: bytes
    started_at_ms: int
    duplicates: list[str] = field(default_factory=list)
    crashes: int = 0  # times it crashed the engine while it ran alone
    crash: Result | None = None  # the last such crash, until settled


class Consumer:
    def __init__(
        self,
        client: redis.Redis,
        backend: GenerationBackend,
        config: ConsumerConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.redis = client
        self.backend = backend
        self.config = config
        self.keys = QueueKeys(config.queue)
        self.name = config.name
        self.clock = clock
        self.outbox = Outbox(self.keys)
        self.reclaimer = Reclaimer(self.keys, self.name, config.min_idle_ms)
        self.janitor = ConsumerJanitor(self.keys, self.name, config.dead_after_ms)
        self.watch = QueueWatch(self.keys, self.name)
        self.guard = Guard(
            url_of(client), config.max_backoff_s, self._wait, self._group_lost, self._recovered, clock
        )
        self.completed = 0
        self._held: dict[str, _Held] = {}
        self._crashed: deque[_Held] = deque()
        self._stop_requested = False
        self._force_stop = False
        self._verify_stream = False
        self._next_heartbeat = 0.0
        self._next_renew = clock() + config.renew_every_s
        self._next_reclaim = 0.0
        self._next_housekeeping = clock() + config.housekeeping_s
        self._group_ready = False

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def data_losses(self) -> int:
        return self.watch.losses

    def request_stop(self) -> None:
        """Stop reading and drain (safe from a signal handler); a second call stops draining."""
        if self._stop_requested:
            self._force_stop = True
        self._stop_requested = True

    def run(self) -> None:
        """Consume until request_stop(), then drain. Raises FatalRedisError (a Redis that will
        not let us work) and BackendUnavailable (after giving the held jobs back)."""
        log.info("worker %s consuming %s (backend %s)", self.name, self.keys.jobs, self.backend.model_name)
        try:
            while not self._stop_requested:
                self.guarded(self.step)
        except BackendUnavailable as exc:
            log.error("the engine is gone for good: %s; giving %d jobs back", exc, len(self._held))
            self._force_stop = True
            self.drain()
            raise
        except BaseException:
            self.backend.close(0)
            raise
        self.drain()

    # ---- errors ----------------------------------------------------------------------------

    def guarded(self, action: Callable[[], object], limit_s: float | None = None) -> bool:
        """Run ``action``; False after a failure it waited out (see worker.queue.guard)."""
        return self.guard.run(action, limit_s, backlog=len(self.outbox))

    def _group_lost(self) -> None:
        self._group_ready = False
        self._verify_stream = True

    def _recovered(self) -> None:
        self._verify_stream = True

    def _wait(self, seconds: float) -> None:
        """Sleep, but keep taking finished results from the backend meanwhile."""
        end = self.clock() + seconds
        while (remaining := end - self.clock()) > 0:
            if self._held:
                self._take_results(self.backend.poll(remaining))
            else:
                time.sleep(remaining)

    # ---- the loop --------------------------------------------------------------------------

    def step(self) -> None:
        """One round of the loop (raises redis errors; ``guarded`` handles them)."""
        if not self._group_ready:
            ensure_group(self.redis, self.keys)
            self._group_ready = True
        self._take_results(self.backend.poll(0))
        now = self.clock()
        if now >= self._next_renew:  # NOTE: before the writes, which fail first when Redis is full
            self._renew()
        self.outbox.flush(self.redis)
        if now >= self._next_heartbeat:
            self._heartbeat("running")
        if self._verify_stream:
            self._check_stream()
        if self._crashed:
            self._settle_crashes()
        if now >= self._next_housekeeping:
            self._housekeeping()
        room = self._room()
        if room > 0 and now >= self._next_reclaim:
            room -= self._reclaim(room)
        got = 0
        if room > 0:
            block_ms = None if (self._held or len(self.outbox)) else int(self.config.block_s * 1000)
            reply = self.redis.xreadgroup(
                self.keys.group,
                self.name,
                {self.keys.jobs: ">"},
                count=min(room, self.config.read_batch),
                block=block_ms,
            )
            entries = [read_entry(entry_id, fields) for entry_id, fields in reply[0][1]] if reply else []
            if entries:
                self.watch.saw(entries[-1].entry_id)
            got = self._intake(entries, [1] * len(entries))
        if self._held and not got:
            self._take_results(self.backend.poll(self.config.poll_s))
        elif not self._held and room <= 0:
            self._wait(self.config.poll_s)

    def _room(self) -> int:
        """How many entries to read now: up to the read window (default: the backend's slots),
        never more than the backend takes."""
        window = self.config.read_window or self.backend.slots
        return min(window - len(self._held), self.backend.free_capacity())

    def _intake(self, entries: list[Entry], deliveries: list[int]) -> int:
        """Hand new entries to the backend; returns how many were submitted."""
        if not entries:
            return 0
        marks = self.redis.hmget(self.keys.done, [entry.job_id for entry in entries])
        submitted = 0
        for entry, mark, attempts in zip(entries, marks, deliveries, strict=True):
            try:
                submitted += self._take_in(entry, mark is not None, attempts)
            except Exception as exc:  # a surprise in one entry is that entry's error
                log.exception("entry %s (job %s) could not be taken in", entry.entry_id, entry.job_id)
                self._held.pop(entry.job_id, None)
                message = f"the worker could not take entry {entry.entry_id} in: {type(exc).__name__}: {exc}"
                self.outbox.add(
                    Completion(
                        error_result(entry.job_id, "internal", message, worker=self.name), entry.entry_id
                    )
                )
        return submitted

    def _take_in(self, entry: Entry, done: bool, attempts: int) -> int:
        if done:
            self.outbox.ack(entry.entry_id)  # completed before: idempotent by job id
            return 0
        if attempts > self.config.max_attempts:
            reason = (
                f"delivered {attempts} times (max_attempts={self.config.max_attempts}); "
                "the workers holding it stopped responding"
            )
            self._dead_letter(entry.job_id, entry.entry_id, entry.data, reason, attempts)
            return 0
        try:
            job = decode_entry(entry)
        except JobError as exc:
            result = error_result(entry.job_id, "invalid_job", str(exc), worker=self.name)
            self.outbox.add(Completion(result, entry.entry_id))
            return 0
        if job.id in self._held:  # enqueued twice, or reclaimed while we run it
            self._held[job.id].duplicates.append(entry.entry_id)
            return 0
        self._held[job.id] = _Held(job, entry.entry_id, entry.data, now_ms())
        try:
            self.backend.submit(job)
        except Exception as exc:  # the contract says submit never raises; one job must not stop others
            log.exception("backend.submit failed for job %s", job.id)
            del self._held[job.id]
            result = error_result(job.id, "internal", f"backend rejected the job: {exc}", worker=self.name)
            self.outbox.add(Completion(result, entry.entry_id))
            return 0
        return 1

    def _dead_letter(
        self,
        job_id: str,
        entry_id: str,
        data: bytes,
        reason: str,
        attempts: int,
        also_ack: tuple[str, ...] = (),
    ) -> None:
        result = error_result(job_id, "dead_letter", reason, worker=self.name)
        self.outbox.add(Completion(result, entry_id, also_ack, dead=DeadLetter(data, reason, attempts)))
        log.warning("job %s dead-lettered: %s", job_id, reason)

    def _take_results(self, results: list[Result]) -> None:
        for result in results:
            held = self._held.get(result.id)
            if held is None:
                log.error("backend returned a result for %r, which this worker does not hold", result.id)
                continue
            if result.error is not None and result.error.code == ENGINE_CRASH:
                held.crash = result  # stays held (its lease renewed) until the attempt is counted
                self._crashed.append(held)
                continue
            del self._held[result.id]
            job = held.job
            timings = Timings(
                enqueued_at_ms=job.enqueued_at_ms, started_at_ms=held.started_at_ms, finished_at_ms=now_ms()
            )
            filled = msgspec.structs.replace(
                result,
                metadata=result.metadata or job.metadata,
                worker=result.worker or self.name,
                model=result.model or self.backend.model_name,
                timings=timings,
            )
            self.outbox.add(Completion(filled, held.entry_id, tuple(held.duplicates)))
            self.completed += 1

    def _settle_crashes(self) -> None:
        """Count an attempt for each job that crashed the engine alone; run it again alone or
        dead-letter it."""
        while self._crashed:
            held = self._crashed[0]
            deliveries = self.reclaimer.count_attempt(self.redis, held.entry_id)
            held.crashes += 1
            attempts = deliveries if deliveries is not None else held.crashes + 1
            self._crashed.popleft()
            why = held.crash.error.message if held.crash is not None and held.crash.error else "engine crash"
            if attempts > self.config.max_attempts:
                del self._held[held.job.id]
                reason = (
                    f"crashed the engine {held.crashes} times when it ran alone "
                    f"(max_attempts={self.config.max_attempts}); last: {why}"
                )
                self._dead_letter(
                    held.job.id, held.entry_id, held.data, reason, attempts, tuple(held.duplicates)
                )
            else:
                log.warning(
                    "job %s crashed the engine alone (delivery %d of %d); running it again alone",
                    held.job.id,
                    attempts,
                    self.config.max_attempts,
                )
                self.backend.submit(held.job)

    def _reclaim(self, room: int) -> int:
        self._next_reclaim = self.clock() + self.config.reclaim_every_s
        claimed = self.reclaimer.claim(self.redis, room)
        if claimed:
            log.info("reclaimed %d pending entries from stopped consumers", len(claimed))
        entries = [read_entry(c.entry_id, c.fields) for c in claimed]
        return self._intake(entries, [c.deliveries for c in claimed])

    def _renew(self) -> None:
        self._next_renew = self.clock() + self.config.renew_every_s
        lost = self.reclaimer.renew(self.redis, [held.entry_id for held in self._held.values()])
        if lost:
            # NOTE: another consumer took these over (we were away longer than min_idle). Both
            # may finish the job; the first result written counts.
            log.warning("lost the lease of %d entries to other consumers", len(lost))

    def _heartbeat(self, state: str) -> None:
        self._next_heartbeat = self.clock() + self.config.heartbeat_s
        beat = Heartbeat(
            name=self.name,
            pid=os.getpid(),
            model=self.backend.model_name,
            capacity=self.config.read_window or self.backend.slots,
            in_flight=len(self._held),
            completed=self.completed,
            state=state,
            last_seen_ms=now_ms(),
            interval_s=self.config.heartbeat_s,
            engine_restarts=self.backend.restarts,
            unattributed_crashes=self.backend.unattributed_crashes,
            data_losses=self.watch.losses,
        )
        self.watch.beat(self.redis, beat)

    def _check_stream(self) -> None:
        self._verify_stream = False
        self.watch.check_stream(self.redis)
        self._heartbeat("running")  # and the epoch, at once

    def _housekeeping(self) -> None:
        self._next_housekeeping = self.clock() + self.config.housekeeping_s
        if self.config.trim_jobs:
            trim_acked_jobs(self.redis, self.keys)
        forgotten = self.janitor.sweep(self.redis)
        if forgotten:
            log.info("forgot %d dead consumers holding nothing: %s", len(forgotten), ", ".join(forgotten))

    # ---- leaving ---------------------------------------------------------------------------

    def drain(self) -> None:
        """Within drain_timeout_s all told: finish held jobs, give the rest back, stop the backend."""
        deadline = self.clock() + self.config.drain_timeout_s
        give_back_at = deadline - min(2.0, 0.25 * self.config.drain_timeout_s)
        log.info("draining %d held jobs (up to %.0fs)", len(self._held), self.config.drain_timeout_s)
        try:
            self.guarded(lambda: self._heartbeat("draining"), limit_s=0.5)
            while self._held and self.clock() < give_back_at and not self._force_stop:
                try:
                    self._take_results(self.backend.poll(min(0.1, max(0.0, give_back_at - self.clock()))))
                except BackendUnavailable:
                    break
                limit = max(0.0, give_back_at - self.clock())
                if (
                    self.guarded(lambda: self.outbox.flush(self.redis), limit)
                    and self.clock() >= self._next_renew
                ):
                    self.guarded(self._renew, limit)
            while self.clock() < deadline:
                if self.guarded(self._release_and_leave, max(0.0, deadline - self.clock())):
                    break
            if self._held or len(self.outbox):
                log.error(
                    "left with %d jobs still held (their entries go back after min_idle) and %d results unwritten",
                    len(self._held),
                    len(self.outbox),
                )
        finally:
            self.backend.close(max(0.0, deadline - self.clock()))

    def _release_and_leave(self) -> None:
        # Released jobs go back as new entries (the old ones are acked in the same
        # transaction), so other workers get them now instead of after min_idle.
        self.outbox.flush(self.redis)
        if self._held:
            with self.redis.pipeline(transaction=True) as pipe:
                for held in self._held.values():
                    pipe.xadd(self.keys.jobs, {FIELD_ID: held.job.id, FIELD_JOB: held.data})
                    pipe.xack(self.keys.jobs, self.keys.group, held.entry_id, *held.duplicates)
                pipe.execute()
            log.info("released %d unfinished jobs back to the queue", len(self._held))
            self._held.clear()
            self._crashed.clear()
        pending = self.redis.xpending_range(
            self.keys.jobs, self.keys.group, min="-", max="+", count=1, consumername=self.name
        )
        if not pending:
            self.redis.xgroup_delconsumer(self.keys.jobs, self.keys.group, self.name)
        self.redis.hdel(self.keys.workers, self.name)
