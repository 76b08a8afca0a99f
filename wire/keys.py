"""Every Redis key name radixq uses, in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "radixq"
DEFAULT_QUEUE = "default"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"  # where a client or worker looks when no URL is given
GROUP = "workers"
# The environment variables that name the queue and the Redis URL, for every side (the client
# CLI, `radixq worker` (worker.config's RADIXQ_<KEY> of its `queue` and `redis_url` settings),
# `radixq run`'s workers and the container health check); the URL's are read in this order.
ENV_PREFIX = "RADIXQ_"
QUEUE_ENV = "RADIXQ_QUEUE"
REDIS_URL_ENVS = ("RADIXQ_REDIS_URL", "REDIS_URL")


def env_queue(environ: Mapping[str, str]) -> str:
    """The queue the environment names (QUEUE_ENV), else the default queue."""
    return environ.get(QUEUE_ENV) or DEFAULT_QUEUE


def env_redis_url(environ: Mapping[str, str]) -> str:
    """The Redis URL the environment names (REDIS_URL_ENVS, first set wins), else the default."""
    return next((environ[name] for name in REDIS_URL_ENVS if environ.get(name)), DEFAULT_REDIS_URL)


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

    def partition(self, index: int) -> str:
        """Stream of partition ``index`` (wire.routing): partition 0 is ``jobs`` itself.

        NOTE: the others carry their own hash tag ``{Q:index}``, so a Redis Cluster spreads
        them over its nodes; every other key of the queue (partition 0 included) shares
        ``{Q}``, the slot of the transactions that must stay atomic (docs/scale-out.md). The
        name ends in ``:index``, so no other queue's key can be spelled the same."""
        return self.jobs if index == 0 else f"{PREFIX}:{{{self.queue}:{index}}}:jobs:{index}"

    def partitions(self, count: int) -> list[str]:
        return [self.partition(index) for index in range(count)]

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
        """Hash job id -> jobs-stream entry id of the delivery whose result counts.

        Set once, in the same script as the result and the ack (worker.queue.streams.writes):
        a job that has it gets no second result, so completion is idempotent by job id. ``dlq
        requeue`` and a rerun of a changed id delete the field: the results stream may then hold
        an older result of the id too, and collect keeps only the one named here.
        """
        return self._key("done")

    @property
    def failed(self) -> str:
        """Hash job id -> error code, for jobs whose counted result is an error."""
        return self._key("failed")

    @property
    def enqueued(self) -> str:
        """Hash job id -> enqueue time in ms: enqueue is idempotent by job id."""
        return self._key("enqueued")

    @property
    def digests(self) -> str:
        """Hash job id -> digest of the content it was enqueued with (producer.digest): an id
        enqueued again with other content is told apart, and collect writes it in each row."""
        return self._key("digests")

    @property
    def order(self) -> str:
        """List of job ids in enqueue order, for ordered collection."""
        return self._key("order")

    @property
    def workers(self) -> str:
        """Hash worker name -> heartbeat (msgpack: capacity, in flight, last seen)."""
        return self._key("workers")

    @property
    def meta(self) -> str:
        """Hash with the queue's ``epoch`` (a random token written once, by the first enqueue),
        ``created_ms``, and its routing (``partitions``, ``prefix_chars``: wire.routing). Workers and collectors remember the epoch they saw: when Redis
        comes back without it, or with another one, they know it lost the queue's data."""
        return self._key("meta")

    @property
    def survey(self) -> str:
        """The pool's last survey (worker.queue.streams.survey): backlog, owners, live workers,
        when it was taken; written by one worker for all, dropped by Redis 10 minutes after."""
        return self._key("survey")

    @property
    def surveying(self) -> str:
        """The lease of the worker taking the pool's survey now (SET NX PX: one at a time)."""
        return self._key("surveying")

    @property
    def requeued(self) -> str:
        """Hash job id -> times ``dlq requeue`` put it back: a resumed collect replaces the
        dead-letter row of such a job with its new result."""
        return self._key("requeued")

    def batch(self, token: str) -> str:
        """The fates of one enqueue batch (producer.insert), kept a few minutes under the token
        its producer drew for it: a retry after a lost reply learns what the first try did."""
        return self._key(f"batch:{token}")

    @property
    def cancelled(self) -> str:
        """Counter: results ``radixq cancel`` wrote (producer.cancel). A worker reads it at each
        heartbeat and, when it moved, stops the jobs it holds that are done (worker.queue.held)."""
        return self._key("cancelled")

    def cancelling(self, token: str) -> str:
        """Set of the job ids one ``cancel --ids`` call cancels (its filter while it scans the
        partition streams); deleted when it ends, else expired by Redis (CANCELLING_TTL_S)."""
        return self._key(f"cancelling:{token}")

    def tag(self, name: str) -> str:
        """Set of the ids of the jobs enqueued with tag ``name`` (producer.tags), which
        ``cancel --tag`` reads; a trimming collect's forgetting removes its ids from it. NOTE:
        the name ends the key, after ``tag:``, so no other key of the queue is spelled the same."""
        return self._key(f"tag:{name}")

    @property
    def tags(self) -> str:
        """Hash job id -> its tag (the first it was enqueued with): forgetting an id removes it
        from its tag's set."""
        return self._key("tags")

    @property
    def files(self) -> str:
        """Hash file id -> its record (``radixq serve``: service.records); the bytes are in the
        service's file storage, never in Redis."""
        return self._key("serve:files")

    @property
    def file_order(self) -> str:
        """Sorted set of file ids by creation time (ms): ``GET /v1/files`` pages through it."""
        return self._key("serve:file_order")

    @property
    def batches(self) -> str:
        """Hash batch id -> its record (``radixq serve``: status, times, file ids, errors)."""
        return self._key("serve:batches")

    @property
    def batch_order(self) -> str:
        """Sorted set of batch ids by creation time (ms): ``GET /v1/batches`` pages through it."""
        return self._key("serve:batch_order")

    @property
    def batch_counts(self) -> str:
        """Hash batch id -> "completed failed": live request counts, written by the service
        that collects the batch."""
        return self._key("serve:batch_counts")

    @property
    def active_batches(self) -> str:
        """Set of the ids of batches not yet in a final state: what each service's supervisor
        looks at to take a batch nobody collects."""
        return self._key("serve:active")

    @property
    def throughput(self) -> str:
        """Stream of samples of the queue's done and failed counts, one per SAMPLE period at
        most (the entry id is the period's start: a second service's sample is refused), kept an
        hour: the dashboard's throughput plot."""
        return self._key("serve:throughput")

    @property
    def group(self) -> str:
        return GROUP


# Field names inside stream entries. jobs: id, job, key (the prefix key, wire.routing). results: id, entry (the jobs-stream entry
# id it answers), result, epoch (the queue's epoch its job was read under; absent: none).
# dead: id, entry, job, reason, attempts.
FIELD_ID = "id"
FIELD_JOB = "job"
FIELD_KEY = "key"
FIELD_RESULT = "result"
FIELD_ENTRY = "entry"
FIELD_REASON = "reason"
FIELD_ATTEMPTS = "attempts"
FIELD_EPOCH = "epoch"
# The ``entry`` of a result written at enqueue for a row rejected there (it has no jobs-stream
# entry): its ``done`` mark, so collect counts it like any other result.
ENTRY_REJECTED = "rejected"
# The ``entry`` (and ``done`` mark) of a result ``radixq cancel`` wrote (producer.cancel).
ENTRY_CANCELLED = "cancelled"
CANCELLING_TTL_S = 3600  # a ``cancel --ids`` filter set left behind by a canceller that died
# Fields of the meta hash.
META_EPOCH = "epoch"
META_CREATED_MS = "created_ms"
META_PARTITIONS = "partitions"  # partition streams of the queue (absent: 1)
META_PREFIX_CHARS = "prefix_chars"  # characters of a prompt that make its prefix key
META_RESULTS_TRIMMED = "results_trimmed"  # results-stream entries below this id were trimmed
META_FORGOTTEN = "forgotten"  # ids a trimming collect removed from the head of order, records and all
META_FORGOTTEN_FAILED = "forgotten_failed"  # of those, the ids whose rows were error rows
META_ENQUEUES_FINISHED = (
    "enqueues_finished"  # `radixq enqueue` commands that put every row in (wire.enqueues)
)
