"""Jobs with several prompts (``Job.prompts``: an OpenAI completions request whose ``prompt`` is
a list): one sub-job per prompt on the generator it wraps, one Result for the job.

The Result numbers its choices as OpenAI does: prompt ``i``'s choice ``c`` is at index
``i * n + c``; usage is summed over the prompts. When a sub-job fails, the job fails with that
error (the first prompt's that failed, naming it); when one crashed the engine alone, the job's
Result is that ENGINE_CRASH once every sub-job has answered, so the consumer counts the attempt
and submits the job again (the sub-job ids are stable: the engine's front end still knows the
culprit and runs it alone). Sub-jobs wait here while the wrapped generator has no room.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from wire.schema import Choice, Job, Result, Usage, error_result
from worker.frontend.contract import ABORTED, ENGINE_CRASH, Generator


@dataclass
class _Group:
    job: Job
    results: dict[int, Result] = field(default_factory=dict)  # prompt index -> its sub-job's


def sub_job_id(job_id: str, index: int) -> str:
    """The id of prompt ``index``'s sub-job: bounded whatever the job id's length, and marked
    so it cannot be mistaken for a job id users write."""
    return f"\x00prompts:{hashlib.sha256(job_id.encode()).hexdigest()[:24]}:{index}"


class PromptLists:
    """Implements worker.frontend.contract.Generator around ``inner``."""

    def __init__(self, inner: Generator) -> None:
        self.inner = inner
        self._groups: dict[str, _Group] = {}  # job id -> its sub-jobs' results so far
        self._parent: dict[str, tuple[str, int]] = {}  # sub-job id -> (job id, prompt index)
        self._pending: deque[Job] = deque()  # sub-jobs the inner generator had no room for
        self._aborted: list[Result] = []  # answers of sub-jobs aborted while they waited here

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def slots(self) -> int:
        return self.inner.slots

    @property
    def restarts(self) -> int:
        return self.inner.restarts

    @property
    def load(self) -> Any:
        """The inner generator's load report (worker.metrics' gauges), None when it has none."""
        return getattr(self.inner, "load", None)

    @property
    def unattributed_crashes(self) -> int:
        return self.inner.unattributed_crashes

    def free_capacity(self) -> int:
        return max(0, self.inner.free_capacity() - len(self._pending))

    def submit(self, job: Job) -> None:
        if job.prompts is None:
            self.inner.submit(job)
            return
        self._groups[job.id] = _Group(job)
        for index, prompt in enumerate(job.prompts):
            sub_id = sub_job_id(job.id, index)
            self._parent[sub_id] = (job.id, index)
            self._pending.append(msgspec.structs.replace(job, id=sub_id, prompts=None, prompt=prompt))
        self._feed()

    def poll(self, timeout_s: float) -> list[Result]:
        answered = []
        aborted, self._aborted = self._aborted, []
        for result in aborted + self.inner.poll(0.0 if aborted else timeout_s):
            parent = self._parent.pop(result.id, None)
            if parent is None:
                answered.append(result)
                continue
            job_id, index = parent
            group = self._groups[job_id]
            group.results[index] = result
            if len(group.results) == len(group.job.prompts or ()):
                del self._groups[job_id]
                answered.append(_merged(group))
        self._feed()
        return answered

    def abort(self, job_id: str) -> None:
        """Abort a job: its sub-jobs still waiting here are answered ``aborted``, the others
        are aborted on the wrapped generator (poll merges the answers). NOTE: a generator
        plugged in without ``abort`` lets its jobs finish."""
        if job_id not in self._groups:
            self._abort_inner(job_id)
            return
        subs = [sub_id for sub_id, (parent, _) in self._parent.items() if parent == job_id]  # unanswered
        waiting = {sub.id for sub in self._pending} & set(subs)
        self._pending = deque(sub for sub in self._pending if sub.id not in waiting)
        for sub_id in subs:
            if sub_id in waiting:
                self._aborted.append(
                    error_result(sub_id, ABORTED, f"job {job_id!r}: aborted before it started")
                )
            else:
                self._abort_inner(sub_id)

    def _abort_inner(self, job_id: str) -> None:
        abort = getattr(self.inner, "abort", None)
        if abort is not None:
            abort(job_id)

    def close(self, timeout_s: float = 30.0) -> None:
        self.inner.close(timeout_s)

    def _feed(self) -> None:
        while self._pending and self.inner.free_capacity() > 0:
            self.inner.submit(self._pending.popleft())


def _merged(group: _Group) -> Result:
    job, results = group.job, [group.results[i] for i in range(len(group.results))]
    failed = [(i, r) for i, r in enumerate(results) if r.error is not None]
    crashed = [(i, r) for i, r in failed if r.error is not None and r.error.code == ENGINE_CRASH]
    if crashed or failed:
        index, first = (crashed or failed)[0]
        assert first.error is not None
        message = f"prompt {index} of {len(results)}: {first.error.message}"
        return msgspec.structs.replace(
            first, id=job.id, error=msgspec.structs.replace(first.error, message=message)
        )
    n = job.sampling.n
    choices = [
        Choice(
            index=i * n + c.index,
            text=c.text,
            token_ids=c.token_ids,
            finish_reason=c.finish_reason,
            logprobs=c.logprobs,
        )
        for i, result in enumerate(results)
        for c in result.choices
    ]
    usage = Usage(
        prompt_tokens=sum(r.usage.prompt_tokens for r in results),
        completion_tokens=sum(r.usage.completion_tokens for r in results),
        cached_tokens=sum(r.usage.cached_tokens for r in results),
    )
    return msgspec.structs.replace(results[0], id=job.id, choices=choices, usage=usage)
