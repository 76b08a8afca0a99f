"""EngineGenerator: the queue consumer's Generator over a supervised scheduler process.

    consumer --submit(Job)--> tokenize --ZMQ--> scheduler process (engine, GPU)
    consumer <--poll()------- detokenize, Result <--ZMQ-- RequestFinished

The scheduler runs in its own process so Redis I/O and tokenization never take its GIL.

Supervision: when the scheduler process dies, the jobs it held are sent again to a fresh one.
The jobs of the step that failed (all it held when it could not say) become suspects and run
one at a time, everything else waiting behind them; a suspect that crashes the engine while it
is the only job there is the culprit and gets an ``engine_crash`` result (the consumer counts
the attempt, and sends it back or dead-letters it). When every suspect finishes alone, the
crash was a workload shape, not a job: nobody is blamed and the event is counted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wire.schema import Job, Result, Timings, error_result
from worker.frontend.contract import ABORTED, ENGINE_CRASH, GeneratorUnavailable
from worker.frontend.process import SchedulerProcess
from worker.frontend.results import build_result
from worker.models.tokenizer import NoTokenizer, load_tokenizer_or_none, prompt_ids
from worker.scheduler.channel import PeerGone
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import AbortRequest, GenerateRequest, RequestFinished

if TYPE_CHECKING:
    from worker.config import WorkerConfig

log = logging.getLogger("radixq.engine")

# Waits before starting a scheduler again: after a crash, then after each failed start in a row;
# when they run out, the engine is given up (GeneratorUnavailable).
RESTART_DELAYS_S = (0.0, 1.0, 5.0, 15.0, 30.0)
MAX_HELD_PER_SLOT = 8  # the most it accepts: a read window beyond that holds no more


@dataclass(frozen=True)
class EngineLoad:
    """The scheduler's load as its latest RequestFinished reported it (worker.metrics' gauges)."""

    running_reqs: int = 0  # held, running or waiting
    pages_used: int = 0
    num_pages: int = 0
    step_s: float = 0.0
    batch_reqs: int = 0  # in the running batch
    waiting_reqs: int = 0  # waiting for admission


@dataclass(frozen=True)
class _Entry:
    uid: str
    job: Job
    input_ids: list[int]


class EngineGenerator:
    """Runs jobs on a supervised scheduler process; see worker.frontend.contract.Generator."""

    def __init__(
        self,
        config: SchedulerProcessConfig,
        *,
        log_level: str = "INFO",
        ready_timeout_s: float = 900,
        restart_delays_s: tuple[float, ...] = RESTART_DELAYS_S,
    ) -> None:
        self.config = config
        self.log_level = log_level
        self.ready_timeout_s = ready_timeout_s
        self.restart_delays_s = restart_delays_s
        self.restarts = 0
        self.unattributed_crashes = 0
        self.rank_losses = 0  # tensor-parallel groups stopped because a follower died
        self._rank_lost_again = False  # a rank was lost and no job has finished since
        self._proc: SchedulerProcess | None = SchedulerProcess(config, log_level)
        try:
            ready = self._proc.wait_ready(ready_timeout_s)
        except BaseException:
            self._proc.stop(0)
            raise
        self.model_name = ready.model_name or config.model
        self.slots = ready.max_running_reqs
        self._tokenizer: Any = load_tokenizer_or_none(ready.model_path)
        self._uids = itertools.count()
        self._inflight: dict[str, _Entry] = {}  # sent to the current scheduler process
        self._waiting: deque[_Entry] = deque()  # not sent yet: a restart or a suspect runs first
        self._suspects: set[str] = set()  # job ids that run alone until they finish
        self._aborting: set[str] = set()  # job ids sent an AbortRequest, not answered yet
        self._done: list[Result] = []
        self._start_at = 0.0  # when to start the next process (while self._proc is None)
        self._failed_starts = 0
        self._crash_reason: str | None = None  # the unexplained crash suspects are re-run for
        self.load = EngineLoad(num_pages=ready.num_pages)

    # ---- Generator ------------------------------------------------------------------------

    @property
    def isolating(self) -> bool:
        """A suspect waits or runs: nothing new is taken until it is settled."""
        if not self._suspects:
            return False
        entries = itertools.chain(self._waiting, self._inflight.values())
        return any(entry.job.id in self._suspects for entry in entries)

    def free_capacity(self) -> int:
        if self._proc is None or self._proc.ready is None or self.isolating:
            return 0
        held = len(self._inflight) + len(self._waiting)
        return max(0, MAX_HELD_PER_SLOT * self.slots - held)

    def submit(self, job: Job) -> None:
        try:
            input_ids = job.input_ids
            if input_ids is None:
                if self._tokenizer is None:
                    raise ValueError(f"model {self.model_name!r} ships no tokenizer; send input_ids")
                input_ids = prompt_ids(self._tokenizer, prompt=job.prompt, messages=job.messages)
        except Exception as exc:  # a template or tokenizer failure belongs to this job alone
            message = f"job {job.id!r}: could not tokenize the {job.prompt_kind}: {exc}"
            self._done.append(self._error(job, "invalid_job", message))
            return
        self._aborting.discard(job.id)  # NOTE: an earlier run of it was aborted; this one runs
        self._waiting.append(_Entry(str(next(self._uids)), job, list(input_ids)))
        self._feed()

    def poll(self, timeout_s: float) -> list[Result]:
        self._supervise()
        if self._proc is not None and self._proc.ready is not None:
            self._receive(0.0 if self._done else timeout_s)
            self._supervise()
        elif not self._done and timeout_s > 0:
            time.sleep(min(timeout_s, 0.05))  # starting a process: nothing can arrive yet
        self._feed()
        results, self._done = self._done, []
        return results

    def abort(self, job_id: str) -> None:
        """A job not sent yet is answered ``aborted`` at once; one the scheduler holds is sent
        an AbortRequest (the scheduler frees it wherever it is: waiting, prefilling, decoding,
        compiling its grammar), and if the process dies first, it is answered instead of sent
        again (``_aborting``)."""
        waiting = next((e for e in self._waiting if e.job.id == job_id), None)
        if waiting is not None:
            self._waiting.remove(waiting)
            self._done.append(self._error(waiting.job, ABORTED, f"job {job_id!r}: aborted before it started"))
            return
        sent = next((e for e in self._inflight.values() if e.job.id == job_id), None)
        if sent is None or job_id in self._aborting:
            return
        self._aborting.add(job_id)
        if self._proc is not None and self._proc.ready is not None:
            with contextlib.suppress(PeerGone):  # it died: _feed answers the job when it comes back
                self._proc.send(AbortRequest(uid=sent.uid))

    def close(self, timeout_s: float = 30.0) -> None:
        if self._proc is not None:
            self._proc.stop(timeout_s)
            self._proc = None

    # ---- supervision -----------------------------------------------------------------------

    def _receive(self, timeout_s: float) -> None:
        assert self._proc is not None
        for message in self._proc.receive(timeout_s):
            if isinstance(message, RequestFinished):
                self.load = EngineLoad(
                    message.running_reqs,
                    message.pages_used,
                    self.load.num_pages,
                    message.step_s,
                    message.batch_reqs,
                    message.waiting_reqs,
                )
                entry = self._inflight.pop(message.uid, None)
                if entry is None:
                    continue
                self._aborting.discard(entry.job.id)
                self._rank_lost_again = False
                try:
                    self._finished(entry, message)
                except Exception as exc:  # e.g. detokenizing: this job's error, not the loop's
                    log.exception("the result of job %s could not be built", entry.job.id)
                    why = f"its result could not be built: {type(exc).__name__}: {exc}"
                    self._done.append(self._error(entry.job, "internal", why))

    def _supervise(self) -> None:
        """Notice a dead process, start a new one when due, notice when it is ready."""
        proc = self._proc
        if proc is None:
            if time.monotonic() >= self._start_at:
                self._proc = SchedulerProcess(self.config, self.log_level)
                self.restarts += 1
            return
        if proc.ready is None:  # a restarted process, still loading
            proc.receive(0.0)
            if proc.ready is not None:
                log.warning("scheduler process restarted (%d restarts so far)", self.restarts)
                self._failed_starts = 0
            elif proc.failure is not None or not proc.alive:
                self._start_failed(f"the engine could not start again: {proc.describe_exit()}")
            elif time.monotonic() - proc.started_at > self.ready_timeout_s:
                self._start_failed(f"the engine did not load within {self.ready_timeout_s:.0f} s")
            return
        if not proc.alive:
            self._receive(0.0)  # what it finished before dying counts
            if proc.rank_lost and not self._rank_lost_again:
                self._rank_lost(proc.describe_exit())
            else:
                self._crashed(proc.describe_exit(), proc.failure.suspect_uids if proc.failure else None)

    def _rank_lost(self, reason: str) -> None:
        """A tensor-parallel follower died: the group is restarted and every job it held runs
        again, nobody blamed. NOTE: a second loss before any job finished goes the way of a
        crash (suspects one at a time), so a job that kills a rank every time is still found."""
        held = self._drop_process()
        self.rank_losses += 1
        self._rank_lost_again = True
        log.error("%s holding %d jobs; they run again on a new group", reason, len(held))
        self._waiting.extendleft(reversed(held))

    def _start_failed(self, why: str) -> None:
        assert self._proc is not None
        self._proc.stop(0)
        self._proc = None
        self._failed_starts += 1
        if self._failed_starts >= len(self.restart_delays_s):
            raise GeneratorUnavailable(f"{why} ({self._failed_starts} tries)")
        delay = self.restart_delays_s[self._failed_starts]
        log.error("%s; trying again in %.0f s", why, delay)
        self._start_at = time.monotonic() + delay

    def _drop_process(self) -> list[_Entry]:
        """Stop the scheduler process that ended (or lost a rank), schedule its restart after the
        first delay, and hand back the jobs it held."""
        assert self._proc is not None
        held = list(self._inflight.values())
        self._inflight.clear()
        self._proc.stop(0)
        self._proc = None
        self._start_at = time.monotonic() + self.restart_delays_s[0]
        return held

    def _crashed(self, reason: str, failing_uids: list[str] | None) -> None:
        held = self._drop_process()
        if len(held) == 1:  # it ran alone: the crash is its own
            (culprit,) = held
            log.error("job %s crashed the engine while it ran alone: %s", culprit.job.id, reason)
            self._suspects.add(culprit.job.id)
            self._crash_reason = None
            self._done.append(self._error(culprit.job, ENGINE_CRASH, reason))
            return
        named = set(failing_uids or ())
        suspects = [e for e in held if e.uid in named] or held
        others = [e for e in held if e not in suspects]
        self._suspects.update(e.job.id for e in suspects)
        self._crash_reason = reason
        log.error(
            "the engine crashed holding %d jobs (%s); re-running %d suspects one at a time",
            len(held),
            reason,
            len(suspects),
        )
        self._waiting.extendleft(reversed(suspects + others))

    def _feed(self) -> None:
        """Send waiting jobs: in order, a suspect only to an empty scheduler, nothing beside it."""
        proc = self._proc
        if proc is None or proc.ready is None:
            return
        while self._waiting:
            if any(e.job.id in self._suspects for e in self._inflight.values()):
                return
            entry = self._waiting[0]
            if entry.job.id in self._aborting:  # NOTE: aborted while a process that died held it
                self._waiting.popleft()
                self._aborting.discard(entry.job.id)
                self._suspects.discard(entry.job.id)
                self._done.append(self._error(entry.job, ABORTED, f"job {entry.job.id!r}: aborted"))
                continue
            if entry.job.id in self._suspects and self._inflight:
                return
            try:
                proc.send(
                    GenerateRequest(uid=entry.uid, input_ids=entry.input_ids, sampling=entry.job.sampling)
                )
            except PeerGone:
                return  # it died; _supervise restarts it and this entry waits for the next one
            self._waiting.popleft()
            self._inflight[entry.uid] = entry

    def _finished(self, entry: _Entry, finished: RequestFinished) -> None:
        job = entry.job
        if job.id in self._suspects:
            self._suspects.discard(job.id)
            if self._crash_reason is not None and not self.isolating:
                self.unattributed_crashes += 1
                log.warning(
                    "no single job reproduces the engine crash (%s): a workload shape; nobody blamed "
                    "(%d such crashes so far)",
                    self._crash_reason,
                    self.unattributed_crashes,
                )
                self._crash_reason = None
        timings = Timings(first_token_at_ms=finished.first_token_at_ms)  # the rest is the consumer's
        if finished.error_code is not None:
            message = f"job {job.id!r}: {finished.error_message or finished.error_code}"
            finished = RequestFinished(
                uid=finished.uid,
                choices=[],
                prompt_tokens=finished.prompt_tokens,
                cached_tokens=0,
                error_code=finished.error_code,
                error_message=message,
            )
        self._done.append(
            build_result(
                job.id,
                finished,
                self._tokenizer or NoTokenizer(),
                timings=timings,
            )
        )

    def _error(self, job: Job, code: str, message: str) -> Result:
        return error_result(job.id, code, message)  # the consumer fills the envelope


def create_engine_generator(config: WorkerConfig) -> EngineGenerator:
    """The engine generator of a worker (the factory ``[worker] generator = "engine"`` names)."""
    return EngineGenerator(config.process_config, log_level=config.worker.log_level)
