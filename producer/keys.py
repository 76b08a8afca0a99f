"""Every Redis key name radixq uses, in one place."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "radixq"
DEFAULT_QUEUE = "default"
GROUP = "workers"


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one named queue."""

    queue: str = DEFAULT_QUEUE

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.queue}}}:{suffix}"

    @property
    def jobs(self) -> str:
        """Stream of encoded jobs (field ``job``), read by the consumer group."""
        return self._key("jobs")

    @property
    def results(self) -> str:
        """Stream of encoded results (field ``result``); may hold duplicates, collect dedupes."""
        return self._key("results")

    @property
    def dead(self) -> str:
        """Dead-letter stream: jobs delivered more than max_attempts times, with the reason."""
        return self._key("dead")

    @property
    def done(self) -> str:
        """Hash job id -> results-stream entry id: completion is idempotent by job id."""
        return self._key("done")

    @property
    def enqueued(self) -> str:
        """Hash job id -> jobs-stream entry id: enqueue is idempotent by job id."""
        return self._key("enqueued")

    @property
    def order(self) -> str:
        """List of job ids in enqueue order, for ordered collection."""
        return self._key("order")

    @property
    def workers(self) -> str:
        """Hash worker name -> heartbeat (msgpack: capacity, in flight, last seen)."""
        return self._key("workers")

    @property
    def group(self) -> str:
        return GROUP
