"""The queue consumer: Redis Streams in, a GenerationBackend in the middle, results out.

One thread runs the loop. Each step: move finished results into the outbox and write them
(result + done mark + ack in one transaction), heartbeat, renew leases on held entries,
reclaim entries of dead consumers, then read new entries - never more than the backend has
room for (``free_capacity``), so a worker does not hoard jobs another worker could run.
A lost Redis connection pauses the loop with exponential backoff; held jobs keep running
and their results wait in the outbox, so nothing is dropped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import redis

from producer.client import ensure_group
from producer.keys import FIELD_ID, FIELD_JOB, QueueKeys
from producer.schema import Job, JobError, Result, Timings, decode_job, error_result
from producer.status import Heartbeat, now_ms
from worker.queue.backend import GenerationBackend
from worker.queue.config import ConsumerConfig
from worker.queue.outbox import Completion, DeadLetter, Outbox
from worker.queue.reclaimer import Reclaimer

log = logging.getLogger("radixq.worker")

_RETRYABLE = (redis.ConnectionError, redis.TimeoutError)


@dataclass
class _Held:
    """A job the backend is running, and the stream entries it answers."""

    job: Job
    entry_id: str
    data: bytes
    started_at_ms: int
    duplicates: list[str] = field(default_factory=list)


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
        self.completed = 0
        self._held: dict[str, _Held] = {}
        self._stop_requested = False
        self._force_stop = False
        self._backoff_s = 0.0
        self._next_heartbeat = 0.0
        self._next_renew = clock() + config.renew_every_s
        self._next_reclaim = 0.0
        self._group_ready = False

    @property
    def held(self) -> int:
        return len(self._held)

    def request_stop(self) -> None:
        """Stop reading and drain (safe from a signal handler); a second call stops draining."""
        if self._stop_requested:
            self._force_stop = True
        self._stop_requested = True

    def run(self) -> None:
        """Consume until request_stop(), then drain and release what is still held."""
        log.info("worker %s consuming %s (backend %s)", self.name, self.keys.jobs, self.backend.model_name)
        while not self._stop_requested:
            self.guarded(self.step)
        self.drain()

    def guarded(self, action: Callable[[], object]) -> bool:
        """Run ``action``; on a lost connection back off (collecting results meanwhile)."""
        try:
            action()
        except _RETRYABLE as exc:
            self._backoff_s = min(self.config.max_backoff_s, max(0.05, self._backoff_s * 2))
            log.warning("redis unavailable (%s); retrying in %.2fs", exc, self._backoff_s)
            self._wait(self._backoff_s)
            return False
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("consumer group missing (redis lost its data?); creating it again")
            self._group_ready = False
            return False
        self._backoff_s = 0.0
        return True

    def _wait(self, seconds: float) -> None:
        """Sleep, but keep taking finished results from the backend meanwhile."""
        end = self.clock() + seconds
        while (remaining := end - self.clock()) > 0:
            if self._held:
                self._take_results(self.backend.poll(remaining))
            else:
                time.sleep(remaining)

    def step(self) -> None:
        """One round of the loop (raises redis.ConnectionError when Redis is away)."""
        if not self._group_ready:
            ensure_group(self.redis, self.keys)
            self._group_ready = True
        self._take_results(self.backend.poll(0))
        self.outbox.flush(self.redis)
        now = self.clock()
        if now >= self._next_heartbeat:
            self._heartbeat("running")
        if now >= self._next_renew:
            self._renew()
        room = self.backend.free_capacity()
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
            entries = [(entry_id.decode(), fields) for entry_id, fields in reply[0][1]] if reply else []
            got = self._intake(entries)
        if self._held and not got:
            self._take_results(self.backend.poll(self.config.poll_s))
        elif not self._held and room <= 0:
            self._wait(self.config.poll_s)

    def _intake(
        self, entries: list[tuple[str, dict[bytes, bytes]]], deliveries: list[int] | None = None
    ) -> int:
        """Hand new entries to the backend; returns how many were submitted."""
        if not entries:
            return 0
        ids = [_text(fields.get(FIELD_ID.encode())) for _, fields in entries]
        marks = self.redis.hmget(self.keys.done, [job_id or "" for job_id in ids])
        submitted = 0
        for i, ((entry_id, fields), job_id, mark) in enumerate(zip(entries, ids, marks, strict=True)):
            if job_id is not None and mark is not None:
                self.outbox.ack(entry_id)  # completed before: idempotent by job id
                continue
            data = fields.get(FIELD_JOB.encode(), b"")
            attempts = deliveries[i] if deliveries else 1
            if attempts > self.config.max_attempts:
                reason = f"delivered {attempts} times (max_attempts={self.config.max_attempts}); the workers holding it stopped responding"
                result = error_result(job_id or entry_id, "dead_letter", reason, worker=self.name)
                self.outbox.add(Completion(result, entry_id, dead=DeadLetter(data, reason, attempts)))
                log.warning("job %s dead-lettered: %s", job_id, reason)
                continue
            try:
                job = decode_job(data)
            except JobError as exc:
                result = error_result(
                    job_id or exc.job_id or entry_id, "invalid_job", str(exc), worker=self.name
                )
                self.outbox.add(Completion(result, entry_id))
                continue
            if job.id in self._held:  # enqueued twice, or reclaimed while we run it
                self._held[job.id].duplicates.append(entry_id)
                continue
            self._held[job.id] = _Held(job, entry_id, data, now_ms())
            try:
                self.backend.submit(job)
            except Exception as exc:  # the contract says submit never raises; one job must not stop others
                log.exception("backend.submit failed for job %s", job.id)
                del self._held[job.id]
                result = error_result(
                    job.id, "internal", f"backend rejected the job: {exc}", worker=self.name
                )
                self.outbox.add(Completion(result, entry_id))
                continue
            submitted += 1
        return submitted

    def _take_results(self, results: list[Result]) -> None:
        for result in results:
            held = self._held.pop(result.id, None)
            if held is None:
                log.error("backend returned a result for %r, which this worker does not hold", result.id)
                continue
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

    def _reclaim(self, room: int) -> int:
        self._next_reclaim = self.clock() + self.config.reclaim_every_s
        claimed = self.reclaimer.claim(self.redis, room)
        if claimed:
            log.info("reclaimed %d pending entries from stopped consumers", len(claimed))
        entries = [(c.entry_id, c.fields) for c in claimed]
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
            capacity=self.backend.free_capacity() + len(self._held),
            in_flight=len(self._held),
            completed=self.completed,
            state=state,
            last_seen_ms=now_ms(),
        )
        self.redis.hset(self.keys.workers, self.name, msgspec.msgpack.encode(beat))

    def drain(self) -> None:
        """Finish held jobs within drain_timeout_s, release the rest to other workers, leave."""
        deadline = self.clock() + self.config.drain_timeout_s
        log.info("draining %d held jobs (up to %.0fs)", len(self._held), self.config.drain_timeout_s)
        self.guarded(lambda: self._heartbeat("draining"))
        while self._held and self.clock() < deadline and not self._force_stop:
            self._take_results(self.backend.poll(0.1))
            if self.guarded(lambda: self.outbox.flush(self.redis)) and self.clock() >= self._next_renew:
                self.guarded(self._renew)
        while self.clock() < deadline + 5.0:
            if self.guarded(self._release_and_leave):
                break
        self.backend.close()

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
        pending = self.redis.xpending_range(
            self.keys.jobs, self.keys.group, min="-", max="+", count=1, consumername=self.name
        )
        if not pending:
            self.redis.xgroup_delconsumer(self.keys.jobs, self.keys.group, self.name)
        self.redis.hdel(self.keys.workers, self.name)


def _text(value: bytes | None) -> str | None:
    return value.decode() if value is not None else None
