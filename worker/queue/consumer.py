"""The consumer: the policy of a worker between its queue and its generator.

    queue --read/reclaim--> Consumer --submit--> Generator (the engine)
    queue <--complete------ Consumer <--poll---- results

One thread runs the loop. Each step: take finished results, renew the leases of held entries,
write results (through the outbox: all or nothing per batch), heartbeat, settle jobs that
crashed the engine, then, only once every result is written, reclaim entries of dead consumers
and read new entries (own partitions first, then stolen: worker.queue.routing), never more than
the window: ``read_window``, by default HELD_PER_SLOT jobs per running slot of the generator
(the engine queues the jobs beyond its slots for its scheduling policy to order), capped by
what the generator takes and by a fair share of the
queue's jobs over the live workers, so one worker does not take a small queue from its
siblings. The survey behind the window and the routing is taken by one consumer for the pool
(worker.queue.streams.survey); reclaim looks where it saw entries of consumers that stopped.
Trimming acknowledged entries, forgetting consumers that died holding nothing and sweeping
every partition for entries nobody renews are the pool's duties, each done about once per
period by the pool as a whole (worker.queue.duties).

Failure belongs to the job: anything that goes wrong with one entry becomes that entry's error
result, and a job that crashes the engine alone collects attempts until it is dead-lettered.
A failed step is judged by worker.queue.guard (an unavailable queue pauses the loop while held
jobs keep running and their results wait in the outbox); worker.queue.watch reports a queue
that lost its data. The queue itself is behind worker.queue.jobqueue.JobQueue.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from wire.schema import Job, JobError, Result, Timings, error_result
from wire.status import Heartbeat, RateWindow, now_ms
from worker.frontend.contract import ENGINE_CRASH, Generator, GeneratorUnavailable
from worker.queue.config import ConsumerConfig
from worker.queue.duties import PoolDuty
from worker.queue.guard import Guard
from worker.queue.jobqueue import Completion, DeadLetter, Delivery, JobQueue, Release, decode_entry, of_epoch
from worker.queue.outbox import Outbox
from worker.queue.routing import PrefixTally, Survey
from worker.queue.watch import QueueWatch

if TYPE_CHECKING:
    from worker.metrics import WorkerMetrics

log = logging.getLogger("radixq.worker")

# read_window 0: the running slots and as many again waiting in the engine, for its policy to
# order by prefix; more would let one worker take what its siblings could start now
HELD_PER_SLOT = 2
# while reads come back full, the backlog figures change nothing: the survey is taken this
# many times less often
FULL_READS_SURVEY_EVERY = 4


@dataclass
class _Held:
    """A job the generator is running, and the entries it answers."""

    job: Job
    entry_id: str
    data: bytes
    key: str  # prefix key
    started_at_ms: int
    epoch: str | None  # the queue's epoch it was read under (its result is written only there)
    leased_at: float  # the consumer's clock when its entry's lease was last renewed (or taken)
    duplicates: list[str] = field(default_factory=list)
    crashes: int = 0  # times it crashed the engine while it ran alone
    crash: Result | None = None  # the last such crash, until settled


def envelope(result: Result, job: Job, started_at_ms: int, worker: str, model: str) -> Result:
    """``result`` as it is written: the job's metadata, the model it names, the worker, and the
    timings (enqueued, taken by this worker, finished now; the first token as the generator
    saw it). A generator reports choices, usage, an error and the first token only; this is
    the one place that fills the rest."""
    timings = Timings(
        enqueued_at_ms=job.enqueued_at_ms,
        started_at_ms=started_at_ms,
        finished_at_ms=now_ms(),
        first_token_at_ms=result.timings.first_token_at_ms,
    )
    return msgspec.structs.replace(result, metadata=job.metadata, worker=worker, model=model, timings=timings)


class Consumer:
    def __init__(
        self,
        queue: JobQueue,
        generator: Generator,
        config: ConsumerConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        metrics: WorkerMetrics | None = None,
        served_models: tuple[str, ...] = (),
    ) -> None:
        """``served_models``: the model names this worker answers to (a job naming another one
        gets a ``model_not_served`` error); empty: any name runs on the generator's model."""
        self.queue = queue
        self.metrics = metrics  # told of each job started and each result (worker.metrics)
        self.generator = generator
        self.config = config
        self.served_models = served_models
        self.name = queue.name
        self.clock = clock
        self.outbox = Outbox()
        self.watch = QueueWatch(config.queue)
        self.guard = Guard(config.max_backoff_s, self._wait, self._group_lost, self._recovered, clock)
        self.completed = 0
        self._rate = RateWindow(window_s=60.0)  # of completed, for the heartbeat
        self.tally = PrefixTally()
        self._survey: Survey | None = None
        self._surveyed_at = -math.inf
        self._short_read = True  # the last read brought fewer entries than it asked for
        self._held: dict[str, _Held] = {}
        self._crashed: deque[_Held] = deque()
        self._stop_requested = False
        self._force_stop = False
        self._verify_stream = False
        self._next_heartbeat = 0.0
        self._epoch_seen = False  # a read told the queue's epoch since the last heartbeat
        self._next_renew = clock() + config.renew_every_s / 2
        self._next_reclaim = 0.0
        rng = random.Random(config.name)
        self._housekeeping = PoolDuty(config.housekeeping_s, clock(), rng)
        self._sweep = PoolDuty(config.reclaim_every_s, clock(), rng)  # reclaim looking in every partition
        self._prepared = False

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
        """Consume until request_stop(), then drain. Raises QueueRefused (a queue that will not
        let us work) and GeneratorUnavailable (after giving the held jobs back)."""
        log.info("worker %s consuming queue %r (%s)", self.name, self.config.queue, self.generator.model_name)
        try:
            while not self._stop_requested:
                self.guarded(self.step)
        except GeneratorUnavailable as exc:
            log.error("the engine is gone for good: %s; giving %d jobs back", exc, len(self._held))
            self._force_stop = True
            self.drain()
            raise
        except BaseException:
            self.generator.close(0)
            raise
        self.drain()

    # ---- errors ----------------------------------------------------------------------------

    def guarded(self, action: Callable[[], object], limit_s: float | None = None) -> bool:
        """Run ``action``; False after a failure it waited out (see worker.queue.guard)."""
        return self.guard.run(action, limit_s, backlog=len(self.outbox))

    def _group_lost(self) -> None:
        self._prepared = False
        self._verify_stream = True

    def _recovered(self) -> None:
        self._verify_stream = True

    def _wait(self, seconds: float) -> None:
        """Sleep, but keep taking finished results from the generator meanwhile."""
        end = self.clock() + seconds
        while (remaining := end - self.clock()) > 0:
            if self._held:
                self._take_results(self.generator.poll(remaining))
            else:
                time.sleep(remaining)

    # ---- the loop --------------------------------------------------------------------------

    def step(self) -> None:
        """One round of the loop (raises what the queue raises; ``guarded`` judges it)."""
        if not self._prepared:
            self._prepared = self.queue.prepare()
            if not self._prepared:  # another consumer of the pool is preparing the queue
                self._wait(self.config.poll_s)
                return
        self._take_results(self.generator.poll(0))
        now = self.clock()
        if now >= self._next_renew:  # NOTE: before the writes, which fail first when Redis is full
            self._renew()
        self.outbox.flush(self.queue)
        if now >= self._next_heartbeat:
            self._heartbeat("running")
        if self._verify_stream:
            self._verify_stream = False
            self.watch.check_stream(self.queue)
            self._epoch_seen = False
            self._heartbeat("running")  # and the epoch, at once
        if self._crashed:
            self._settle_crashes()
        if self._housekeeping.due(now, self._live):
            self._housekeeping.done(now)
            forgotten = self.queue.housekeeping(self.config.trim_jobs)
            if forgotten:
                log.info("forgot %d dead consumers holding nothing: %s", len(forgotten), ", ".join(forgotten))
        room = self._resurvey(now, self._room())
        if self._survey is None:
            room = 0  # NOTE: nothing is read before the first survey says which partitions are ours
        if room > 0 and now >= self._next_reclaim:
            self._next_reclaim = now + self.config.reclaim_every_s
            sweep = self._sweep.due(now, self._live)
            if sweep:
                self._sweep.done(now)
            claimed = self.queue.reclaim(room, sweep)
            if claimed:
                log.info("reclaimed %d pending entries from stopped consumers", len(claimed))
            room -= self._intake(claimed)
        got = 0
        if room > 0:
            block_s = None if (self._held or len(self.outbox)) else self.config.block_s
            wanted = min(room, self.config.read_batch)
            fresh = self.queue.read(wanted, block_s)
            self._short_read = len(fresh) < wanted
            for delivery in fresh:  # NOTE: from several partitions, the last is not the newest
                self.watch.saw(delivery.entry.entry_id)
            got = self._intake(fresh)
        if self._held and not got:
            self._take_results(self.generator.poll(self.config.poll_s))
        elif not self._held and room <= 0:
            self._wait(self.config.poll_s)

    def _resurvey(self, now: float, room: int) -> int:
        """Take a new survey when one is due; returns the room it leaves. Due: every survey_s
        while reads come back short (the backlog is what decides), every
        FULL_READS_SURVEY_EVERY x survey_s while they come back full; within a tenth of
        survey_s when the window is held shut by an old survey while the generator has room
        (jobs may have come since); never while the generator is full (nothing to decide)."""
        survey_s, free = self.config.survey_s, self.generator.free_capacity()
        if self._survey is not None and min(self.read_window - len(self._held), free) <= 0:
            return room
        every_s = survey_s if self._short_read else FULL_READS_SURVEY_EVERY * survey_s
        if now >= self._surveyed_at + every_s:
            max_age_s = survey_s
        elif room <= 0 < free and now >= self._surveyed_at + 0.1 * survey_s:
            max_age_s = 0.1 * survey_s
        else:
            return room
        self._surveyed_at = now
        survey = self.queue.survey(max_age_s)
        if survey is None:  # another consumer is taking the pool's first survey: ask again soon
            self._surveyed_at = now - every_s + 0.1 * survey_s
            return room
        self._survey = survey
        return self._room()

    @property
    def _live(self) -> int:
        """Live workers in the last survey: the pool that shares the duties (worker.queue.duties)."""
        return self._survey.live if self._survey is not None else 1

    @property
    def read_window(self) -> int:
        """The most jobs this worker holds: ``read_window``, or 0 for HELD_PER_SLOT per slot of
        the generator (its heartbeat's capacity; a survey's fair share may hold it lower)."""
        return self.config.read_window or HELD_PER_SLOT * self.generator.slots

    def _room(self) -> int:
        """How many entries to take now: never more than the generator takes, nor beyond the
        read window and the fair share of the last survey, at least 1."""
        window = self.read_window
        if self._survey is not None:
            window = max(1, min(window, self._survey.fair_share()))
        return min(window - len(self._held), self.generator.free_capacity())

    def _intake(self, deliveries: list[Delivery]) -> int:
        """Hand new entries to the generator; returns how many were submitted."""
        if not deliveries:
            return 0
        for epoch in {d.epoch for d in deliveries}:
            self.watch.saw_epoch(epoch)
        self._epoch_seen = True
        done = self.queue.completed([d.entry.job_id for d in deliveries])
        submitted = 0
        for delivery, is_done in zip(deliveries, done, strict=True):
            entry = delivery.entry
            try:
                submitted += self._take_in(delivery, is_done)
            except Exception as exc:  # a surprise in one entry is that entry's error
                log.exception("entry %s (job %s) could not be taken in", entry.entry_id, entry.job_id)
                self._held.pop(entry.job_id, None)
                message = f"the worker could not take entry {entry.entry_id} in: {type(exc).__name__}: {exc}"
                result = error_result(entry.job_id, "internal", message, worker=self.name)
                self._complete(Completion(result, entry.entry_id, epoch=delivery.epoch))
        return submitted

    def _take_in(self, delivery: Delivery, done: bool) -> int:
        entry = delivery.entry
        if done:
            self.outbox.ack(entry.entry_id)  # completed before: idempotent by job id
            return 0
        if delivery.deliveries > self.config.max_attempts:
            reason = (
                f"delivered {delivery.deliveries} times (max_attempts={self.config.max_attempts}); "
                "the workers holding it stopped responding"
            )
            self._dead_letter(
                entry.job_id, entry.entry_id, entry.data, reason, delivery.deliveries, epoch=delivery.epoch
            )
            return 0
        try:
            job = decode_entry(entry)
        except JobError as exc:
            result = error_result(entry.job_id, "invalid_job", str(exc), worker=self.name)
            self._complete(Completion(result, entry.entry_id, epoch=delivery.epoch))
            return 0
        if self.served_models and job.model is not None and job.model not in self.served_models:
            served = ", ".join(repr(name) for name in self.served_models)
            message = f"job {job.id!r}: model {job.model!r} is not served by this worker (it serves {served})"
            result = error_result(
                job.id, "model_not_served", message, metadata=job.metadata, worker=self.name
            )
            self._complete(Completion(result, entry.entry_id, epoch=delivery.epoch))
            return 0
        held = self._held.get(job.id)
        if held is not None and not of_epoch(held.epoch, delivery.epoch):
            # NOTE: Redis lost the queue it was read from, and the job was enqueued again: the
            # run under way answers the new entry (its old entries are gone with that queue)
            held.entry_id, held.data, held.duplicates, held.epoch, held.leased_at = (
                entry.entry_id,
                entry.data,
                [],
                delivery.epoch,
                self.clock(),
            )
            return 0
        if held is not None:  # enqueued twice, or reclaimed while we run it
            held.duplicates.append(entry.entry_id)
            return 0
        self._held[job.id] = _Held(
            job, entry.entry_id, entry.data, entry.key, now_ms(), delivery.epoch, self.clock()
        )
        try:
            self.generator.submit(job)
        except Exception as exc:  # the contract says submit never raises; one job must not stop others
            log.exception("generator.submit failed for job %s", job.id)
            del self._held[job.id]
            result = error_result(
                job.id, "internal", f"the generator rejected the job: {exc}", worker=self.name
            )
            self._complete(Completion(result, entry.entry_id, epoch=delivery.epoch))
            return 0
        if self.metrics is not None:
            self.metrics.started(job, self._held[job.id].started_at_ms)
        return 1

    def _complete(self, completion: Completion) -> None:
        """A result for the outbox to write."""
        self.outbox.add(completion)
        if self.metrics is not None:
            self.metrics.result(completion.result, dead_lettered=completion.dead is not None)

    def _dead_letter(
        self,
        job_id: str,
        entry_id: str,
        data: bytes,
        reason: str,
        attempts: int,
        also_ack: tuple[str, ...] = (),
        epoch: str | None = None,
    ) -> None:
        result = error_result(job_id, "dead_letter", reason, worker=self.name)
        letter = DeadLetter(data, reason, attempts)
        self._complete(Completion(result, entry_id, also_ack, dead=letter, epoch=epoch))
        log.warning("job %s dead-lettered: %s", job_id, reason)

    def _take_results(self, results: list[Result]) -> None:
        for result in results:
            held = self._held.get(result.id)
            if held is None:
                log.error(
                    "the generator returned a result for %r, which this worker does not hold", result.id
                )
                continue
            if result.error is not None and result.error.code == ENGINE_CRASH:
                held.crash = result  # stays held (its lease renewed) until the attempt is counted
                self._crashed.append(held)
                continue
            del self._held[result.id]
            self.tally.saw(held.key, result.usage.prompt_tokens, result.usage.cached_tokens)
            job = held.job
            filled = envelope(result, job, held.started_at_ms, self.name, self._reply_model(job, result))
            self._complete(Completion(filled, held.entry_id, tuple(held.duplicates), epoch=held.epoch))
            self.completed += 1

    def _reply_model(self, job: Job, result: Result) -> str:
        """The model a result names: the served name the job asked for (else the worker's first
        served name), or, with no served names, the model that ran."""
        if self.served_models:
            return job.model if job.model in self.served_models else self.served_models[0]
        return result.model or self.generator.model_name

    def _settle_crashes(self) -> None:
        """Count an attempt for each job that crashed the engine alone; run it again alone or
        dead-letter it."""
        while self._crashed:
            held = self._crashed[0]
            deliveries = self.queue.count_attempt(held.entry_id)
            held.leased_at = self.clock()
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
                    held.job.id,
                    held.entry_id,
                    held.data,
                    reason,
                    attempts,
                    tuple(held.duplicates),
                    held.epoch,
                )
            else:
                log.warning(
                    "job %s crashed the engine alone (delivery %d of %d); running it again alone",
                    held.job.id,
                    attempts,
                    self.config.max_attempts,
                )
                self.generator.submit(held.job)

    def _renew(self) -> None:
        """Renew the leases taken or renewed renew_every_s ago or more (checked twice as often):
        none is left idle for more than 1.5 x renew_every_s (half of min_idle), and a job that
        finishes within renew_every_s is never renewed."""
        now = self.clock()
        self._next_renew = now + self.config.renew_every_s / 2
        due = [held for held in self._held.values() if now - held.leased_at >= self.config.renew_every_s]
        if not due:
            return
        lost = self.queue.renew([held.entry_id for held in due])
        for held in due:
            held.leased_at = now
        if lost:
            # NOTE: another consumer took these over (we were away longer than min_idle). Both
            # may finish the job; the first result written counts.
            log.warning("lost the lease of %d entries to other consumers", len(lost))

    def _heartbeat(self, state: str) -> None:
        self._next_heartbeat = self.clock() + self.config.heartbeat_s
        beat = Heartbeat(
            name=self.name,
            pid=os.getpid(),
            model=self.generator.model_name,
            capacity=self.read_window,
            in_flight=len(self._held),
            completed=self.completed,
            state=state,
            last_seen_ms=now_ms(),
            interval_s=self.config.heartbeat_s,
            engine_restarts=self.generator.restarts,
            unattributed_crashes=self.generator.unattributed_crashes,
            data_losses=self.watch.losses,
            jobs_per_s=self._rate.sample(self.clock(), self.completed)[0],
            prompt_tokens=self.tally.prompt_tokens,
            cached_tokens=self.tally.cached_tokens,
            prefix_keys=self.tally.prefix_keys,
            partitions=self._survey.own if self._survey is not None else [],
        )
        self.watch.beat(self.queue, beat, epoch=not self._epoch_seen)
        self._epoch_seen = False

    # ---- leaving ---------------------------------------------------------------------------

    def drain(self) -> None:
        """Within drain_timeout_s all told: finish held jobs, give the rest back, stop the generator."""
        deadline = self.clock() + self.config.drain_timeout_s
        give_back_at = deadline - min(2.0, 0.25 * self.config.drain_timeout_s)
        log.info("draining %d held jobs (up to %.0fs)", len(self._held), self.config.drain_timeout_s)
        try:
            self.guarded(lambda: self._heartbeat("draining"), limit_s=0.5)
            while self._held and self.clock() < give_back_at and not self._force_stop:
                try:
                    self._take_results(self.generator.poll(min(0.1, max(0.0, give_back_at - self.clock()))))
                except GeneratorUnavailable:
                    break
                limit = max(0.0, give_back_at - self.clock())
                if (
                    self.guarded(lambda: self.outbox.flush(self.queue), limit)
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
            self.generator.close(max(0.0, deadline - self.clock()))

    def _release_and_leave(self) -> None:
        self.outbox.flush(self.queue)
        if self._held:
            dropped = self.queue.release(
                [
                    Release(h.job.id, h.data, (h.entry_id, *h.duplicates), h.key, h.epoch)
                    for h in self._held.values()
                ]
            )
            log.info("released %d unfinished jobs back to the queue", len(self._held) - len(dropped))
            if dropped:
                log.error(
                    "DATA LOSS: %d unfinished jobs were read before Redis lost the queue; not given back "
                    "to the queue it has now",
                    len(dropped),
                )
            self._held.clear()
            self._crashed.clear()
        self.queue.leave()
