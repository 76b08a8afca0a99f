"""The interface between the Redis queue consumer and whatever generates completions."""

from __future__ import annotations

from typing import Protocol

from producer.schema import Job, Result


class GenerationBackend(Protocol):
    """A front end to an engine, as the queue consumer drives it.

    Contract:
    - ``free_capacity()`` says how many more jobs ``submit`` will take now; the consumer
      reads no more than that from Redis (backpressure).
    - ``submit(job)`` never raises for a bad job: it reports an error Result through
      ``poll`` instead (e.g. a prompt longer than the context), so one job cannot stop others.
    - ``poll(timeout_s)`` returns the Results finished since the last call, waiting up to
      ``timeout_s`` for the first one; each submitted job yields exactly one Result.
    - ``close()`` releases processes and memory; jobs not yet returned are abandoned (the
      queue reclaims them).
    """

    model_name: str

    def free_capacity(self) -> int: ...

    def submit(self, job: Job) -> None: ...

    def poll(self, timeout_s: float) -> list[Result]: ...

    def close(self) -> None: ...
