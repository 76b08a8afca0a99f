"""A worker's Prometheus metrics, served on ``/metrics`` when ``[worker] metrics_port`` is set.

The consumer reports each job it starts (hands to the generator) and each result it produces
(before the outbox writes it); the gauges read the consumer and the generator when scraped.
Every metric carries ``queue`` and ``model`` labels (the model: the worker's first served name,
else the model it runs), as vLLM's carry ``model_name``; Prometheus adds ``instance`` (one per
worker port). The server starts before the model loads (``serve_registry``: a port that is
taken stops the worker at once) with one gauge, ``radixq_worker_loading{queue}`` (1 while
loading, then 0; no model label: the model is not known yet); the other metrics are
registered once the model is known.
docs/operations.md (Metrics) lists them; examples/grafana-dashboard.json charts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from wire.schema import Job, Result

# Seconds: from milliseconds (a fast fake job) to an hour (a long queue wait).
_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
# Time per output token: a GPU decode step takes milliseconds, a CPU one up to a second or so.
_TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
_LABELS = ["queue", "model"]


@dataclass(frozen=True)
class ServedRegistry:
    """The registry a worker serves on ``/metrics``, from before its model loads."""

    registry: CollectorRegistry
    loading: Any  # radixq_worker_loading{queue}: 1 until the model is loaded (``loaded``)

    def loaded(self) -> None:
        self.loading.set(0)


def serve_registry(port: int, queue: str) -> ServedRegistry:
    """A registry served on ``port`` (all interfaces) from a daemon thread, holding only
    ``radixq_worker_loading`` (1) until WorkerMetrics fills it once the model is known; raises
    OSError when the port is taken. NOTE: a scrape during a load of minutes gets that gauge,
    not an empty page."""
    registry = CollectorRegistry()
    loading = Gauge(
        "radixq_worker_loading",
        "1 while the worker gets its model (download, load, compile), 0 once it runs jobs.",
        ["queue"],
        registry=registry,
    ).labels(queue)
    loading.set(1)
    start_http_server(port, registry=registry)
    return ServedRegistry(registry, loading)


class WorkerMetrics:
    """The metrics of one worker, in a registry of its own. The labelled children are resolved
    once here (a ``labels()`` lookup per result would cost more than the count)."""

    def __init__(self, queue: str, model: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.queue = queue
        self.model = model

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, _LABELS, registry=self.registry).labels(queue, model)  # exported at 0

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = _BUCKETS_S) -> Any:
            return Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry).labels(queue, model)

        self.jobs_started = counter("radixq_jobs_started", "Jobs handed to the generator.")
        self.jobs_finished = counter("radixq_jobs_finished", "Jobs whose result has no error.")
        self.jobs_failed = Counter(
            "radixq_jobs_failed",
            "Jobs whose result is an error (dead letters included), by code.",
            [*_LABELS, "code"],
            registry=self.registry,
        )
        self.jobs_dead_lettered = counter(
            "radixq_jobs_dead_lettered", "Jobs moved to the dead-letter stream."
        )
        self.prompt_tokens = counter("radixq_prompt_tokens", "Prompt tokens of finished jobs (input).")
        self.output_tokens = counter(
            "radixq_output_tokens", "Generated tokens of finished jobs (all choices)."
        )
        self.cached_tokens = counter(
            "radixq_cached_tokens", "Prompt tokens of finished jobs served from the prefix cache."
        )
        self.queue_wait = histogram(
            "radixq_job_queue_wait_seconds", "From enqueue to the worker starting the job."
        )
        self.job_latency = histogram(
            "radixq_job_latency_seconds", "From the worker starting the job to its result."
        )
        self.first_token = histogram(
            "radixq_time_to_first_token_seconds",
            "From the worker starting the job to its first output token (engine queueing and prefill).",
        )
        self.per_token = histogram(
            "radixq_time_per_output_token_seconds",
            "After the first token, seconds per further output token of the job's longest choice.",
            _TOKEN_BUCKETS_S,
        )

    def gauges(self, held: Callable[[], float], generator: Any) -> None:
        """Gauges read at scrape time: jobs held by the worker, and what the generator's
        ``load`` reports (the engine's last report; absent for generators without one)."""

        def gauge(name: str, doc: str, read: Callable[[], float]) -> None:
            Gauge(name, doc, _LABELS, registry=self.registry).labels(self.queue, self.model).set_function(
                read
            )

        def load(field: str) -> Callable[[], float]:
            return lambda: float(getattr(getattr(generator, "load", None), field, 0))

        gauge("radixq_running_jobs", "Jobs the worker holds (running or waiting in its engine).", held)
        gauge("radixq_engine_running_requests", "Requests in the engine's scheduler.", load("running_reqs"))
        gauge(
            "radixq_requests_running",
            "Requests (choices) in the engine's running batch: decoding, or a prompt being prefilled.",
            load("batch_reqs"),
        )
        gauge("radixq_requests_waiting", "Requests (choices) waiting for admission.", load("waiting_reqs"))
        gauge(
            "radixq_kv_pages_used",
            "KV cache pages in use (running requests and the prefix cache).",
            load("pages_used"),
        )
        gauge("radixq_kv_pool_pages", "KV cache pages in the pool.", load("num_pages"))
        gauge(
            "radixq_step_seconds",
            "Mean scheduler step time since the engine's previous report.",
            load("step_s"),
        )

    # ---- what the consumer reports ------------------------------------------------------------

    def started(self, job: Job, started_at_ms: int) -> None:
        self.jobs_started.inc()
        if job.enqueued_at_ms:
            self.queue_wait.observe(max(0, started_at_ms - job.enqueued_at_ms) / 1000)

    def result(self, result: Result, dead_lettered: bool) -> None:
        if dead_lettered:
            self.jobs_dead_lettered.inc()
        if result.error is not None:
            self.jobs_failed.labels(self.queue, self.model, result.error.code).inc()
            return
        self.jobs_finished.inc()
        self.prompt_tokens.inc(result.usage.prompt_tokens)
        self.output_tokens.inc(result.usage.completion_tokens)
        self.cached_tokens.inc(result.usage.cached_tokens)
        timings = result.timings
        if timings.started_at_ms and timings.finished_at_ms:
            self.job_latency.observe(max(0, timings.finished_at_ms - timings.started_at_ms) / 1000)
        if timings.started_at_ms and timings.first_token_at_ms:
            self.first_token.observe(max(0, timings.first_token_at_ms - timings.started_at_ms) / 1000)
            longest = max((len(choice.token_ids) for choice in result.choices), default=0)
            if longest > 1 and timings.finished_at_ms:
                decode_s = max(0, timings.finished_at_ms - timings.first_token_at_ms) / 1000
                self.per_token.observe(decode_s / (longest - 1))
