"""A worker's Prometheus metrics, served on ``/metrics`` when ``[worker] metrics_port`` is set.

The consumer reports each job it starts (hands to the generator) and each result it produces
(before the outbox writes it); the gauges read the consumer and the generator when scraped.
Every metric carries a ``queue`` label; Prometheus adds ``instance`` (one per worker port).
README "Progress, status and metrics" lists them; examples/grafana-dashboard.json charts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from producer.schema import Job, Result

# Seconds: from milliseconds (a fast fake job) to an hour (a long queue wait).
_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class WorkerMetrics:
    """The metrics of one worker, in a registry of its own. The queue-labelled children are
    resolved once here (a ``labels()`` lookup per result would cost more than the count)."""

    def __init__(self, queue: str) -> None:
        self.registry = CollectorRegistry()
        self.queue = queue

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, ["queue"], registry=self.registry).labels(queue)  # exported at 0

        def histogram(name: str, doc: str) -> Any:
            return Histogram(name, doc, ["queue"], buckets=_BUCKETS_S, registry=self.registry).labels(queue)

        self.jobs_started = counter("radixq_jobs_started", "Jobs handed to the generator.")
        self.jobs_finished = counter("radixq_jobs_finished", "Jobs whose result has no error.")
        self.jobs_failed = Counter(
            "radixq_jobs_failed",
            "Jobs whose result is an error (dead letters included), by code.",
            ["queue", "code"],
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

    def gauges(self, held: Callable[[], float], generator: Any) -> None:
        """Gauges read at scrape time: jobs held by the worker, and what the generator's
        ``load`` reports (the engine's last report; absent for generators without one)."""

        def gauge(name: str, doc: str, read: Callable[[], float]) -> None:
            Gauge(name, doc, ["queue"], registry=self.registry).labels(self.queue).set_function(read)

        def load(field: str) -> Callable[[], float]:
            return lambda: float(getattr(getattr(generator, "load", None), field, 0))

        gauge("radixq_running_jobs", "Jobs the worker holds (running or waiting in its engine).", held)
        gauge("radixq_engine_running_requests", "Requests in the engine's scheduler.", load("running_reqs"))
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

    def serve(self, port: int) -> None:
        """Serve ``/metrics`` on ``port`` (all interfaces) from a daemon thread; raises OSError
        when the port is taken."""
        start_http_server(port, registry=self.registry)

    # ---- what the consumer reports ------------------------------------------------------------

    def started(self, job: Job, started_at_ms: int) -> None:
        self.jobs_started.inc()
        if job.enqueued_at_ms:
            self.queue_wait.observe(max(0, started_at_ms - job.enqueued_at_ms) / 1000)

    def result(self, result: Result, dead_lettered: bool) -> None:
        if dead_lettered:
            self.jobs_dead_lettered.inc()
        if result.error is not None:
            self.jobs_failed.labels(self.queue, result.error.code).inc()
            return
        self.jobs_finished.inc()
        self.prompt_tokens.inc(result.usage.prompt_tokens)
        self.output_tokens.inc(result.usage.completion_tokens)
        self.cached_tokens.inc(result.usage.cached_tokens)
        timings = result.timings
        if timings.started_at_ms and timings.finished_at_ms:
            self.job_latency.observe(max(0, timings.finished_at_ms - timings.started_at_ms) / 1000)
