"""A Generator for queue tests and the queue benchmark: deterministic fake completions.

It answers each job after ``latency_s`` (or at once, ``aborted``, after ``abort``) with text and token ids derived from the job id, so
any test can recompute the expected output independently. Jobs can ask for failure through
their metadata: ``{"fake_error": "internal"}`` yields an error Result with that code. It
records the most jobs it ever held at once, so tests can check backpressure.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

from wire.schema import Choice, Job, Result, Usage, error_result


def fake_token_ids(job_id: str, count: int) -> list[int]:
    digest = hashlib.sha256(job_id.encode()).digest()
    return [digest[i % len(digest)] + 3 for i in range(count)]


def fake_text(job_id: str, index: int = 0) -> str:
    return f"fake completion {index} of {job_id}"


def prompt_tokens(job: Job) -> int:
    if job.input_ids is not None:
        return len(job.input_ids)
    if job.prompt is not None:
        return len(job.prompt.split())
    return sum(len(message.content.split()) for message in job.messages or [])


class FakeGenerator:
    model_name = "fake-model"
    restarts = 0
    unattributed_crashes = 0

    def __init__(
        self,
        capacity: int = 64,
        latency_s: float = 0.0,
        max_completion_tokens: int = 8,
        slow_ids: frozenset[str] = frozenset(),
        slow_s: float = 0.0,
    ) -> None:
        self.capacity = capacity
        self.slots = capacity
        self.latency_s = latency_s
        self.slow_ids = slow_ids  # these jobs take slow_s instead of latency_s
        self.slow_s = slow_s
        self.log_jobs = False  # log a line per finished job (a worker's log while run shows progress)
        self.max_completion_tokens = max_completion_tokens
        self.max_held = 0
        self.submitted: list[str] = []
        self.aborted: list[str] = []  # job ids abort() stopped
        self.closed = False
        self._active: list[tuple[float, Job]] = []
        self._answered: list[Result] = []  # aborted, for the next poll

    def free_capacity(self) -> int:
        return max(0, self.capacity - len(self._active))

    def submit(self, job: Job) -> None:
        if len(self._active) >= self.capacity:
            raise AssertionError(
                f"submit beyond capacity {self.capacity}: the consumer ignored free_capacity()"
            )
        latency_s = self.slow_s if job.id in self.slow_ids else self.latency_s
        self._active.append((time.monotonic() + latency_s, job))
        self.submitted.append(job.id)
        self.max_held = max(self.max_held, len(self._active))

    def poll(self, timeout_s: float) -> list[Result]:
        if self._answered:
            timeout_s = 0.0
        now = time.monotonic()
        if self._active and all(at > now for at, _ in self._active):
            earliest = min(at for at, _ in self._active)
            time.sleep(min(timeout_s, earliest - now))  # simulated latency: until the first job is done
            now = time.monotonic()
        elif not self._active and timeout_s > 0:
            time.sleep(min(timeout_s, 0.01))  # simulated latency: an idle poll blocks, as the engine's does
        ready = [job for at, job in self._active if at <= now]
        done = {id(job) for job in ready}
        self._active = [(at, job) for at, job in self._active if id(job) not in done]
        answered, self._answered = self._answered, []
        return answered + [self.complete(job) for job in ready]

    def complete(self, job: Job) -> Result:
        if self.log_jobs:
            logging.getLogger("radixq.fake").info("finished job %s", job.id)
        code = job.metadata.get("fake_error")
        if code:
            return error_result(job.id, str(code), f"fake failure asked for by job {job.id}")
        count = min(job.sampling.max_tokens, self.max_completion_tokens)
        finish = "length" if job.sampling.max_tokens <= self.max_completion_tokens else "stop"
        choices = [
            Choice(
                index=i,
                text=fake_text(job.id, i),
                token_ids=fake_token_ids(job.id, count),
                finish_reason=finish,
            )
            for i in range(job.sampling.n)
        ]
        usage = Usage(prompt_tokens=prompt_tokens(job), completion_tokens=count * job.sampling.n)
        return Result(id=job.id, choices=choices, usage=usage)

    def abort(self, job_id: str) -> None:
        """A held job is answered ``aborted`` by the next poll (as an engine stops a request)."""
        held = [(at, job) for at, job in self._active if job.id == job_id]
        if not held:
            return
        self._active = [(at, job) for at, job in self._active if job.id != job_id]
        self.aborted.append(job_id)
        if self.log_jobs:
            logging.getLogger("radixq.fake").info("aborted job %s", job_id)
        self._answered.append(error_result(job_id, "aborted", f"job {job_id} aborted"))

    def close(self, timeout_s: float = 30.0) -> None:
        self.closed = True


def create_generator(config: Any) -> FakeGenerator:
    """The factory `radixq worker --generator tests.fake_generator:create_generator` calls.

    Environment: RADIXQ_FAKE_CAPACITY (default 64), RADIXQ_FAKE_LATENCY_S (default 0),
    RADIXQ_FAKE_SLOW_IDS (comma-separated job ids that take RADIXQ_FAKE_SLOW_S instead),
    RADIXQ_FAKE_START_S (seconds it takes to start, as a model load does), RADIXQ_FAKE_START_FILE
    (it starts once this file exists: a load the test ends), RADIXQ_FAKE_LOG (1: a log line
    per finished job).
    """
    time.sleep(float(os.environ.get("RADIXQ_FAKE_START_S", "0")))  # simulated latency: a model load
    start_file = os.environ.get("RADIXQ_FAKE_START_FILE")
    if start_file:
        from tests.waiting import wait_until

        wait_until(lambda: os.path.exists(start_file), f"the start file {start_file}")
    generator = FakeGenerator(
        capacity=int(os.environ.get("RADIXQ_FAKE_CAPACITY", "64")),
        latency_s=float(os.environ.get("RADIXQ_FAKE_LATENCY_S", "0")),
        slow_ids=frozenset(filter(None, os.environ.get("RADIXQ_FAKE_SLOW_IDS", "").split(","))),
        slow_s=float(os.environ.get("RADIXQ_FAKE_SLOW_S", "0")),
    )
    generator.log_jobs = os.environ.get("RADIXQ_FAKE_LOG") == "1"
    return generator
