"""Results waiting to be written, and the one transaction that writes them.

For every completion the transaction adds the result to the results stream, marks the job
done (HSETNX: the first completion of a job id wins), records an error code in ``failed``,
adds a dead letter where there is one, and acks the jobs-stream entries - all in one
MULTI/EXEC. A completion leaves the outbox only after EXEC returned, so a lost connection
drops nothing: the next flush writes it again (at worst a duplicate result, which collect
ignores because the ``done`` mark names one entry). A result is encoded when it is added: one
that cannot be (it should not happen: jobs are validated) is replaced by an ``internal`` error,
so a bad result can never block the writes of the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from producer.keys import (
    FIELD_ATTEMPTS,
    FIELD_ENTRY,
    FIELD_ID,
    FIELD_JOB,
    FIELD_REASON,
    FIELD_RESULT,
    QueueKeys,
)
from producer.schema import Result, encode, error_result

log = logging.getLogger("radixq.worker")


@dataclass(frozen=True)
class DeadLetter:
    job: bytes
    reason: str
    attempts: int


@dataclass(frozen=True)
class Completion:
    result: Result
    entry_id: str  # the jobs-stream entry this result answers
    also_ack: tuple[str, ...] = ()  # further entries of the same job id (duplicates)
    dead: DeadLetter | None = None


@dataclass(frozen=True)
class _Encoded:
    completion: Completion
    data: bytes


def _encode(completion: Completion) -> _Encoded:
    try:
        return _Encoded(completion, encode(completion.result))
    except Exception as exc:
        result = completion.result
        log.exception("the result of job %s cannot be encoded", result.id)
        message = f"the result could not be encoded ({type(exc).__name__}: {exc}); metadata dropped"
        fallback = error_result(result.id, "internal", message, worker=result.worker, model=result.model)
        return _Encoded(
            Completion(fallback, completion.entry_id, completion.also_ack, completion.dead), encode(fallback)
        )


class Outbox:
    def __init__(self, keys: QueueKeys) -> None:
        self.keys = keys
        self._completions: list[_Encoded] = []
        self._acks: list[str] = []  # entries to ack with no result (job already done)

    def __len__(self) -> int:
        return len(self._completions) + len(self._acks)

    def add(self, completion: Completion) -> None:
        self._completions.append(_encode(completion))

    def ack(self, entry_id: str) -> None:
        self._acks.append(entry_id)

    def flush(self, client: redis.Redis, max_batch: int = 512) -> int:
        """Write everything; returns how many completions were written. Raises on connection loss."""
        written = 0
        while self._completions or self._acks:
            batch = self._completions[:max_batch]
            acks = self._acks[:max_batch]
            with client.pipeline(transaction=True) as pipe:
                for completion in batch:
                    self._queue(pipe, completion)
                if acks:
                    pipe.xack(self.keys.jobs, self.keys.group, *acks)
                pipe.execute()
            del self._completions[: len(batch)]
            del self._acks[: len(acks)]
            written += len(batch)
        return written

    def _queue(self, pipe: redis.client.Pipeline, encoded: _Encoded) -> None:
        keys = self.keys
        completion = encoded.completion
        result = completion.result
        pipe.xadd(
            keys.results,
            {FIELD_ID: result.id, FIELD_ENTRY: completion.entry_id, FIELD_RESULT: encoded.data},
        )
        pipe.hsetnx(keys.done, result.id, completion.entry_id)
        if result.error is not None:
            pipe.hset(keys.failed, result.id, result.error.code)
        if completion.dead is not None:
            pipe.xadd(
                keys.dead,
                {
                    FIELD_ID: result.id,
                    FIELD_ENTRY: completion.entry_id,
                    FIELD_JOB: completion.dead.job,
                    FIELD_REASON: completion.dead.reason,
                    FIELD_ATTEMPTS: completion.dead.attempts,
                },
            )
        pipe.xack(keys.jobs, keys.group, completion.entry_id, *completion.also_ack)
