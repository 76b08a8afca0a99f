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

What becomes of each entry taken in, and of each result, is worker.queue.held's (failure
belongs to the job: one entry's trouble is that entry's error result). A failed step is judged by worker.queue.guard (an unavailable queue pauses the loop while held
jobs keep running and their results wait in the outbox); worker.queue.watch reports a queue
that lost its data. The queue itself is behind worker.queue.jobqueue.JobQueue.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wire.status import Heartbeat, RateWindow, now_ms
from worker.frontend.contract import Generator, GeneratorUnavailable
from worker.queue.config import ConsumerConfig
from worker.queue.duties import PoolDuty
from worker.queue.guard import Guard
from worker.queue.held import HeldJobs
from worker.queue.jobqueue import Delivery, JobQueue
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
        device: str = "",
    ) -> None:
        """``metrics``: told of each job started and each result (worker.metrics);
        ``served_models``: the model names this worker answers to (worker.queue.held), which
        its heartbeat announces (``radixq serve`` checks batches against them); ``device``:
        where the generator runs, for the heartbeat."""
        self.queue = queue
        self.generator = generator
        self.config = config
        self.name = queue.name
        self.clock = clock
        self.outbox = Outbox()
        self.jobs = HeldJobs(queue, generator, self.outbox, config, clock, metrics, served_models)
        self.served_models = served_models
        self.device = device
        self.watch = QueueWatch(config.queue)
        self.guard = Guard(config.max_backoff_s, self._wait, self._group_lost, self._recovered, clock)
        self._rate = RateWindow(window_s=60.0)  # of completed and output tokens, for the heartbeat
        self._survey: Survey | None = None
        self._surveyed_at = -math.inf
        self._short_read = True  # the last read brought fewer entries than it asked for
        self._stop_requested = False
        self._force_stop = False
        self._verify_stream = False
        self._next_heartbeat = 0.0
        self._epoch_seen = False  # a read told the queue's epoch since the last heartbeat
        self._cancels_seen = 0  # the queue's cancel count (JobQueue.cancel_count) last looked at
        self._next_renew = clock() + config.renew_every_s / 2
        self._next_reclaim = 0.0
        rng = random.Random(config.name)
        self._housekeeping = PoolDuty(config.housekeeping_s, clock(), rng)
        self._sweep = PoolDuty(config.reclaim_every_s, clock(), rng)  # reclaim looking in every partition
        self._prepared = False

    @property
    def held(self) -> int:
        return len(self.jobs)

    @property
    def completed(self) -> int:
        """Results this worker produced (its heartbeat's ``completed``)."""
        return self.jobs.completed

    @property
    def tally(self) -> PrefixTally:
        """Prompt and cached tokens by prefix key, as the heartbeat reports them."""
        return self.jobs.tally

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
            log.error("the engine is gone for good: %s; giving %d jobs back", exc, len(self.jobs))
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
            if self.jobs:
                self.jobs.take_results(self.generator.poll(remaining))
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
        self.jobs.take_results(self.generator.poll(0))
        now = self.clock()
        if now >= self._next_renew:  # NOTE: before the writes, which fail first when Redis is full
            self._renew()
        self.outbox.flush(self.queue)
        if now >= self._next_heartbeat:
            self._heartbeat("running")
            self._stop_cancelled()
        if self._verify_stream:
            self._verify_stream = False
            self.watch.check_stream(self.queue)
            self._epoch_seen = False
            self._heartbeat("running")  # and the epoch, at once
        if self.jobs.crashed:
            self.jobs.settle_crashes()
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
            block_s = None if (self.jobs or len(self.outbox)) else self.config.block_s
            wanted = min(room, self.config.read_batch)
            fresh = self.queue.read(wanted, block_s)
            self._short_read = len(fresh) < wanted
            for delivery in fresh:  # NOTE: from several partitions, the last is not the newest
                self.watch.saw(delivery.entry.entry_id)
            got = self._intake(fresh)
        if self.jobs and not got:
            self.jobs.take_results(self.generator.poll(self.config.poll_s))
        elif not self.jobs and room <= 0:
            self._wait(self.config.poll_s)

    def _resurvey(self, now: float, room: int) -> int:
        """Take a new survey when one is due; returns the room it leaves. Due: every survey_s
        while reads come back short (the backlog is what decides), every
        FULL_READS_SURVEY_EVERY x survey_s while they come back full; within a tenth of
        survey_s when the window is held shut by an old survey while the generator has room
        (jobs may have come since); never while the generator is full (nothing to decide)."""
        survey_s, free = self.config.survey_s, self.generator.free_capacity()
        if self._survey is not None and min(self.read_window - len(self.jobs), free) <= 0:
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
        return min(window - len(self.jobs), self.generator.free_capacity())

    def _intake(self, deliveries: list[Delivery]) -> int:
        """Hand new entries to the generator; returns how many were submitted."""
        if not deliveries:
            return 0
        for epoch in {d.epoch for d in deliveries}:
            self.watch.saw_epoch(epoch)
        self._epoch_seen = True
        return self.jobs.take_in(deliveries)

    def _renew(self) -> None:
        """Renew the leases taken or renewed renew_every_s ago or more (checked twice as often):
        none is left idle for more than 1.5 x renew_every_s (half of min_idle), and a job that
        finishes within renew_every_s is never renewed."""
        now = self.clock()
        self._next_renew = now + self.config.renew_every_s / 2
        self.jobs.renew(now)

    def _stop_cancelled(self) -> None:
        """When ``radixq cancel`` wrote results since the last look (its counter moved), abort
        the held jobs that are done. NOTE: a job taken in after a cancel is never run: intake
        acknowledges the entry of a job that is done (worker.queue.held)."""
        count = self.queue.cancel_count()
        if count != self._cancels_seen:
            self._cancels_seen = count
            self.jobs.stop_done()

    def _heartbeat(self, state: str) -> None:
        self._next_heartbeat = self.clock() + self.config.heartbeat_s
        jobs_per_s, tokens_per_s = self._rate.sample(
            self.clock(), self.jobs.completed, self.jobs.output_tokens
        )
        # NOTE: every held job is submitted; the generator runs up to its slots, the rest wait in it
        running = min(len(self.jobs), self.generator.slots)
        beat = Heartbeat(
            name=self.name,
            pid=os.getpid(),
            model=self.generator.model_name,
            capacity=self.read_window,
            in_flight=len(self.jobs),
            completed=self.jobs.completed,
            state=state,
            last_seen_ms=now_ms(),
            interval_s=self.config.heartbeat_s,
            engine_restarts=self.generator.restarts,
            unattributed_crashes=self.generator.unattributed_crashes,
            data_losses=self.watch.losses,
            jobs_per_s=jobs_per_s,
            prompt_tokens=self.tally.prompt_tokens,
            cached_tokens=self.tally.cached_tokens,
            prefix_keys=self.tally.prefix_keys,
            partitions=self._survey.own if self._survey is not None else [],
            served_models=list(self.served_models),
            device=self.device,
            running=running,
            waiting=len(self.jobs) - running,
            tokens_per_s=tokens_per_s,
        )
        self.watch.beat(self.queue, beat, epoch=not self._epoch_seen)
        self._epoch_seen = False

    # ---- leaving ---------------------------------------------------------------------------

    def drain(self) -> None:
        """Within drain_timeout_s all told: finish held jobs, give the rest back, stop the generator."""
        deadline = self.clock() + self.config.drain_timeout_s
        give_back_at = deadline - min(2.0, 0.25 * self.config.drain_timeout_s)
        log.info("draining %d held jobs (up to %.0fs)", len(self.jobs), self.config.drain_timeout_s)
        try:
            self.guarded(lambda: self._heartbeat("draining"), limit_s=0.5)
            while self.jobs and self.clock() < give_back_at and not self._force_stop:
                try:
                    self.jobs.take_results(
                        self.generator.poll(min(0.1, max(0.0, give_back_at - self.clock())))
                    )
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
            if self.jobs or len(self.outbox):
                log.error(
                    "left with %d jobs still held (their entries go back after min_idle) and %d results unwritten",
                    len(self.jobs),
                    len(self.outbox),
                )
        finally:
            self.generator.close(max(0.0, deadline - self.clock()))

    def _release_and_leave(self) -> None:
        self.outbox.flush(self.queue)
        self.jobs.release()
        self.queue.leave()
