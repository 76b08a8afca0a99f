"""The jobs a worker holds: entries taken in, their results out, crashes counted.

    deliveries --take_in--> HeldJobs --submit--> Generator
    outbox <--Completion--- HeldJobs <--results-- (take_results)

Failure belongs to the job: anything that goes wrong with one entry becomes that entry's error
result, and a job that crashes the engine alone collects attempts until it is dead-lettered.
An entry answers its job once: one already done is only acknowledged, one delivered again while
its job runs is acknowledged with that job's result. worker.queue.consumer decides when and how
many entries come in; this module decides what becomes of each.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from wire.schema import Job, JobError, Result, Timings, error_result
from wire.status import now_ms
from worker.frontend.contract import ENGINE_CRASH, Generator
from worker.queue.config import ConsumerConfig
from worker.queue.jobqueue import Completion, DeadLetter, Delivery, JobQueue, Release, decode_entry, of_epoch
from worker.queue.outbox import Outbox
from worker.queue.routing import PrefixTally

if TYPE_CHECKING:
    from worker.metrics import WorkerMetrics

log = logging.getLogger("radixq.worker")


@dataclass
class Held:
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
    stopping: bool = False  # done elsewhere (radixq cancel, another worker): aborted, only acked


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


class HeldJobs:
    def __init__(
        self,
        queue: JobQueue,
        generator: Generator,
        outbox: Outbox,
        config: ConsumerConfig,
        clock: Callable[[], float],
        metrics: WorkerMetrics | None,
        served_models: tuple[str, ...],
    ) -> None:
        """``served_models``: the model names this worker answers to (a job naming another one
        gets a ``model_not_served`` error); empty: any name runs on the generator's model."""
        self.queue = queue
        self.name = queue.name
        self.generator = generator
        self.outbox = outbox  # where every completion goes
        self.config = config
        self.clock = clock
        self.metrics = metrics  # told of each job started and each result (worker.metrics)
        self.served_models = served_models
        self.tally = PrefixTally()  # prompt and cached tokens by prefix key, for the heartbeat
        self.completed = 0
        self.output_tokens = 0  # completion tokens of the results it produced (heartbeat's tok/s)
        self._jobs: dict[str, Held] = {}
        self._crashed: deque[Held] = deque()

    def __len__(self) -> int:
        return len(self._jobs)

    def job_ids(self) -> list[str]:
        return list(self._jobs)

    @property
    def crashed(self) -> bool:
        """Jobs that crashed the engine alone wait for settle_crashes."""
        return bool(self._crashed)

    def take_in(self, deliveries: list[Delivery]) -> int:
        """Hand new entries to the generator; returns how many were submitted."""
        if not deliveries:
            return 0
        done = self.queue.completed([d.entry.job_id for d in deliveries])
        submitted = 0
        for delivery, is_done in zip(deliveries, done, strict=True):
            entry = delivery.entry
            try:
                submitted += self._take_one(delivery, is_done)
            except Exception as exc:  # a surprise in one entry is that entry's error
                log.exception("entry %s (job %s) could not be taken in", entry.entry_id, entry.job_id)
                self._jobs.pop(entry.job_id, None)
                message = f"the worker could not take entry {entry.entry_id} in: {type(exc).__name__}: {exc}"
                result = error_result(entry.job_id, "internal", message, worker=self.name)
                self._complete(Completion(result, entry.entry_id, epoch=delivery.epoch))
        return submitted

    def _take_one(self, delivery: Delivery, done: bool) -> int:
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
        held = self._jobs.get(job.id)
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
        self._jobs[job.id] = Held(
            job, entry.entry_id, entry.data, entry.key, now_ms(), delivery.epoch, self.clock()
        )
        try:
            self.generator.submit(job)
        except Exception as exc:  # the contract says submit never raises; one job must not stop others
            log.exception("generator.submit failed for job %s", job.id)
            del self._jobs[job.id]
            result = error_result(
                job.id, "internal", f"the generator rejected the job: {exc}", worker=self.name
            )
            self._complete(Completion(result, entry.entry_id, epoch=delivery.epoch))
            return 0
        if self.metrics is not None:
            self.metrics.started(job, self._jobs[job.id].started_at_ms)
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

    def stop_done(self) -> int:
        """Abort the held jobs whose result was written elsewhere (``radixq cancel``, or another
        worker that ran them): a job still waiting in the engine never runs, a running one stops
        where the engine can. Their answers are not written, only their entries acknowledged
        (take_results). Returns how many were aborted."""
        held = [h for h in self._jobs.values() if not h.stopping and h.crash is None]
        if not held:
            return 0
        done = self.queue.completed([h.job.id for h in held])
        stopped = [h for h, is_done in zip(held, done, strict=True) if is_done]
        for h in stopped:
            h.stopping = True
            self.generator.abort(h.job.id)
        if stopped:
            log.info(
                "aborting %d held jobs that have a result already (cancelled, or run elsewhere)", len(stopped)
            )
        return len(stopped)

    def take_results(self, results: list[Result]) -> None:
        """The generator's results, as completions in the outbox (a crash waits for
        settle_crashes)."""
        for result in results:
            held = self._jobs.get(result.id)
            if held is None:
                log.error(
                    "the generator returned a result for %r, which this worker does not hold", result.id
                )
                continue
            if held.stopping:  # NOTE: its job is done: the entries are answered, nothing is written
                del self._jobs[result.id]
                for entry_id in (held.entry_id, *held.duplicates):
                    self.outbox.ack(entry_id)
                continue
            if result.error is not None and result.error.code == ENGINE_CRASH:
                held.crash = result  # stays held (its lease renewed) until the attempt is counted
                self._crashed.append(held)
                continue
            del self._jobs[result.id]
            self.tally.saw(held.key, result.usage.prompt_tokens, result.usage.cached_tokens)
            job = held.job
            filled = envelope(result, job, held.started_at_ms, self.name, self._reply_model(job, result))
            self._complete(Completion(filled, held.entry_id, tuple(held.duplicates), epoch=held.epoch))
            self.completed += 1
            self.output_tokens += result.usage.completion_tokens

    def _reply_model(self, job: Job, result: Result) -> str:
        """The model a result names: the served name the job asked for (else the worker's first
        served name), or, with no served names, the model that ran."""
        if self.served_models:
            return job.model if job.model in self.served_models else self.served_models[0]
        return result.model or self.generator.model_name

    def settle_crashes(self) -> None:
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
                del self._jobs[held.job.id]
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

    def renew(self, now: float) -> None:
        """Renew the leases taken or renewed renew_every_s ago or more."""
        due = [held for held in self._jobs.values() if now - held.leased_at >= self.config.renew_every_s]
        if not due:
            return
        lost = self.queue.renew([held.entry_id for held in due])
        for held in due:
            held.leased_at = now
        if lost:
            # NOTE: another consumer took these over (we were away longer than min_idle). Both
            # may finish the job; the first result written counts.
            log.warning("lost the lease of %d entries to other consumers", len(lost))

    def release(self) -> None:
        """Give every held job back to the queue (a draining worker), then hold none."""
        if not self._jobs:
            return
        dropped = self.queue.release(
            [
                Release(h.job.id, h.data, (h.entry_id, *h.duplicates), h.key, h.epoch)
                for h in self._jobs.values()
            ]
        )
        log.info("released %d unfinished jobs back to the queue", len(self._jobs) - len(dropped))
        if dropped:
            log.error(
                "DATA LOSS: %d unfinished jobs were read before Redis lost the queue; not given back "
                "to the queue it has now",
                len(dropped),
            )
        self._jobs.clear()
        self._crashed.clear()
