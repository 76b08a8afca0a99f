"""EngineBackend: the queue consumer's GenerationBackend over a scheduler process.

    consumer --submit(Job)--> tokenize --ZMQ--> scheduler process (engine, GPU)
    consumer <--poll()------- detokenize, Result <--ZMQ-- RequestFinished

The scheduler runs in its own process so Redis I/O and tokenization never take its GIL.
"""

from __future__ import annotations

import itertools
import multiprocessing
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from producer.schema import Job, Result, Timings, error_result
from worker.engine.config import EngineConfig
from worker.frontend.channel import FrontendChannel, ZmqSchedulerIO
from worker.frontend.results import build_result
from worker.models.tokenizer import NoTokenizer, load_tokenizer_or_none, prompt_ids
from worker.scheduler.messages import (
    GenerateRequest,
    RequestFinished,
    SchedulerReady,
    ShutdownRequest,
)

INFLIGHT_PER_SLOT = 2  # jobs held per running slot: enough to keep the scheduler fed


def _now_ms() -> int:
    return int(time.time() * 1000)


def _scheduler_main(config: EngineConfig, inbound_addr: str, outbound_addr: str) -> None:
    """Entry of the scheduler process."""
    from worker.scheduler import run_scheduler

    io = ZmqSchedulerIO(inbound_addr, outbound_addr)
    try:
        run_scheduler(config, io)
    finally:
        io.close()


@dataclass(frozen=True)
class _InFlight:
    job: Job
    started_at_ms: int


class EngineBackend:
    """Runs jobs on a scheduler process; see worker.queue.backend.GenerationBackend."""

    def __init__(self, config: EngineConfig, *, worker_name: str = "", ready_timeout_s: float = 900) -> None:
        self.config = config
        self.worker_name = worker_name
        self._socket_dir = tempfile.mkdtemp(prefix="radixq-")
        self._channel = FrontendChannel(self._socket_dir)
        self._process = multiprocessing.get_context("spawn").Process(
            target=_scheduler_main,
            args=(config, self._channel.inbound_addr, self._channel.outbound_addr),
            name="radixq-scheduler",
            daemon=True,
        )
        self._process.start()
        self._inflight: dict[str, _InFlight] = {}
        self._done: list[Result] = []
        self._uids = itertools.count()
        ready = self._wait_ready(ready_timeout_s)
        self.model_name = ready.model_name or config.model
        self.max_inflight = ready.max_running_reqs * INFLIGHT_PER_SLOT
        self._tokenizer = load_tokenizer_or_none(ready.model_path)

    def _wait_ready(self, timeout_s: float) -> SchedulerReady:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            for message in self._channel.receive(timeout_s=1.0):
                if isinstance(message, SchedulerReady):
                    return message
        self.close()
        raise TimeoutError(f"scheduler did not load {self.config.model!r} within {timeout_s:.0f} s")

    def _check_alive(self) -> None:
        if not self._process.is_alive():
            code = self._process.exitcode
            raise RuntimeError(f"the scheduler process exited (code {code}); see its log above")

    def free_capacity(self) -> int:
        return max(0, self.max_inflight - len(self._inflight))

    def submit(self, job: Job) -> None:
        started_at_ms = _now_ms()
        try:
            input_ids = job.input_ids
            if input_ids is None:
                if self._tokenizer is None:
                    raise ValueError(f"model {self.model_name!r} ships no tokenizer; send input_ids")
                input_ids = prompt_ids(self._tokenizer, prompt=job.prompt, messages=job.messages)
        except Exception as exc:  # a template or tokenizer failure belongs to this job alone
            self._done.append(
                error_result(
                    job.id,
                    "invalid_job",
                    f"job {job.id!r}: could not tokenize the {job.prompt_kind}: {exc}",
                    metadata=job.metadata,
                    model=self.model_name,
                    worker=self.worker_name,
                )
            )
            return
        uid = str(next(self._uids))
        self._inflight[uid] = _InFlight(job, started_at_ms)
        self._channel.send(GenerateRequest(uid=uid, input_ids=list(input_ids), sampling=job.sampling))

    def poll(self, timeout_s: float) -> list[Result]:
        if not self._done:
            self._check_alive()
        wait_s = 0.0 if self._done else timeout_s
        for message in self._channel.receive(wait_s):
            if isinstance(message, RequestFinished):
                self._done.append(self._result(message))
        results, self._done = self._done, []
        return results

    def _result(self, finished: RequestFinished) -> Result:
        entry = self._inflight.pop(finished.uid)
        job = entry.job
        timings = Timings(
            enqueued_at_ms=job.enqueued_at_ms,
            started_at_ms=entry.started_at_ms,
            finished_at_ms=_now_ms(),
        )
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
        return build_result(
            job.id,
            finished,
            self._tokenizer or NoTokenizer(),
            metadata=job.metadata,
            model=self.model_name,
            worker=self.worker_name,
            timings=timings,
        )

    def close(self) -> None:
        if self._process.is_alive():
            self._channel.send(ShutdownRequest())
            self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=10)
        self._channel.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)


def create_backend(options: dict[str, Any]) -> EngineBackend:
    """Build the engine backend from worker options: ``config`` (a TOML file whose [engine]
    table holds EngineConfig fields), ``model`` and any EngineConfig field as overrides,
    ``worker_name``. A None value means "not given"."""
    from worker.frontend.options import engine_config_from

    given = {k: v for k, v in options.items() if v is not None}
    worker_name = str(given.pop("worker_name", ""))
    return EngineBackend(engine_config_from(given), worker_name=worker_name)
