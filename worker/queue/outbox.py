"""Results waiting to be written, and what writing them means.

A completion leaves the outbox only after the queue has written it (``JobQueue.complete``:
result, done mark, error code, dead letter and acknowledgement, all or nothing), so a queue
that is away drops nothing: the next flush writes it again (at worst a duplicate result, which
collect ignores because the done mark names one entry). A result is encoded when it is added:
one that cannot be (it should not happen: jobs are validated) is replaced by an ``internal``
error, so a bad result can never block the writes of the others.
"""

from __future__ import annotations

import logging

from producer.schema import encode, error_result
from worker.queue.jobqueue import Completion, JobQueue, Write

log = logging.getLogger("radixq.worker")


def _encode(completion: Completion) -> Write:
    try:
        return Write(completion, encode(completion.result))
    except Exception as exc:
        result = completion.result
        log.exception("the result of job %s cannot be encoded", result.id)
        message = f"the result could not be encoded ({type(exc).__name__}: {exc}); metadata dropped"
        fallback = error_result(result.id, "internal", message, worker=result.worker, model=result.model)
        return Write(
            Completion(fallback, completion.entry_id, completion.also_ack, completion.dead), encode(fallback)
        )


class Outbox:
    def __init__(self) -> None:
        self._writes: list[Write] = []
        self._acks: list[str] = []  # entries to acknowledge with no result (job already done)

    def __len__(self) -> int:
        return len(self._writes) + len(self._acks)

    def add(self, completion: Completion) -> None:
        self._writes.append(_encode(completion))

    def ack(self, entry_id: str) -> None:
        self._acks.append(entry_id)

    def flush(self, queue: JobQueue, max_batch: int = 512) -> int:
        """Write everything, ``max_batch`` at a time; returns how many completions were written.
        Raises what the queue raises (what was not written stays)."""
        written = 0
        while self._writes or self._acks:
            writes, acks = self._writes[:max_batch], self._acks[:max_batch]
            queue.complete(writes, acks)
            del self._writes[: len(writes)]
            del self._acks[: len(acks)]
            written += len(writes)
        return written
