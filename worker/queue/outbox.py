"""Results waiting to be written, and what writing them means.

A completion leaves the outbox only after the queue has written it (``JobQueue.complete``:
result, done mark, error code, dead letter and acknowledgement, all or nothing), so a queue
that is away drops nothing: the next flush writes it again (at worst a duplicate result, which
collect ignores because the done mark names one entry). A result is encoded when it is added:
one that cannot be (it should not happen: jobs are validated) is replaced by an ``internal``
error, and one larger than MAX_RESULT_BYTES (many long choices with top_logprobs) by a
``result_too_large`` error, so a bad result can never block the writes of the others: Redis
drops the connection on a value over its ``proto-max-bulk-len`` (512 MB by default), which
reads as a transient error, and the batch holding it would be retried for ever. A flush
writes at most MAX_BATCH_BYTES of results per transaction (Redis holds a MULTI's commands
in memory until EXEC). A result whose job was read before Redis lost the queue (another
epoch: worker.queue.jobqueue) is dropped by the queue, not written: it is logged as DATA LOSS
and counted in ``dropped``.
"""

from __future__ import annotations

import logging

from wire.schema import encode, error_result
from worker.queue.jobqueue import Completion, JobQueue, Write

log = logging.getLogger("radixq.worker")
MAX_RESULT_BYTES = 256 << 20  # one encoded result; Redis refuses values over 512 MB by default
MAX_BATCH_BYTES = 64 << 20  # results written in one transaction (at least one result)
RESULT_TOO_LARGE = "result_too_large"  # error code


def _encode(completion: Completion) -> Write:
    result = completion.result
    try:
        data = encode(result)
    except Exception as exc:
        log.exception("the result of job %s cannot be encoded", result.id)
        message = f"the result could not be encoded ({type(exc).__name__}: {exc}); metadata dropped"
        return _replaced(completion, "internal", message)
    if len(data) > MAX_RESULT_BYTES:
        log.error(
            "the result of job %s is %d bytes, over %d: written as an error",
            result.id,
            len(data),
            MAX_RESULT_BYTES,
        )
        message = (
            f"the result is {len(data)} bytes, over the limit of {MAX_RESULT_BYTES} bytes; ask for fewer "
            "choices (n), fewer tokens (max_tokens) or fewer top_logprobs"
        )
        return _replaced(completion, RESULT_TOO_LARGE, message)
    return Write(completion, data)


def _replaced(completion: Completion, code: str, message: str) -> Write:
    result = completion.result
    fallback = error_result(
        result.id, code, message, worker=result.worker, model=result.model, timings=result.timings
    )
    return Write(
        Completion(fallback, completion.entry_id, completion.also_ack, completion.dead), encode(fallback)
    )


class Outbox:
    def __init__(self) -> None:
        self._writes: list[Write] = []
        self._acks: list[str] = []  # entries to acknowledge with no result (job already done)
        self.dropped = 0  # results the queue refused: their job came from a queue Redis lost

    def __len__(self) -> int:
        return len(self._writes) + len(self._acks)

    def add(self, completion: Completion) -> None:
        self._writes.append(_encode(completion))

    def ack(self, entry_id: str) -> None:
        self._acks.append(entry_id)

    def flush(self, queue: JobQueue, max_batch: int = 512) -> int:
        """Write everything, ``max_batch`` (and MAX_BATCH_BYTES) at a time; returns how many
        completions were written. Raises what the queue raises (what was not written stays)."""
        written = 0
        while self._writes or self._acks:
            count, size = 0, 0
            for write in self._writes[:max_batch]:
                if count and size + len(write.data) > MAX_BATCH_BYTES:
                    break
                count, size = count + 1, size + len(write.data)
            writes, acks = self._writes[:count], self._acks[:max_batch]
            dropped = queue.complete(writes, acks)
            del self._writes[: len(writes)]
            del self._acks[: len(acks)]
            written += len(writes) - len(dropped)
            if dropped:
                self.dropped += len(dropped)
                ids = ", ".join(w.completion.result.id for w in dropped[:3])
                log.error(
                    "DATA LOSS: dropped %d results (e.g. %s) of jobs read before Redis lost the queue "
                    "(epoch %s is gone): they are not written into the queue it has now",
                    len(dropped),
                    ids,
                    dropped[0].completion.epoch,
                )
        return written
