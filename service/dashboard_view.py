"""What the dashboard shows, read from Redis in one pass: the queue, its workers, the batches,
the dead letters, and the throughput of the last hour as an SVG polyline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis

from producer.client import Client, DeadLetter
from service.records import FINAL, BatchRecord, Records
from service.supervisor import read_throughput
from wire.keys import QueueKeys
from wire.status import QueueStatus, read_status

PLOT_W, PLOT_H = 600, 120
DEAD_SHOWN = 50
BATCHES_SHOWN = 20


@dataclass
class WorkerRow:
    name: str
    alive: bool
    heartbeat_age_s: float | None
    model: str
    device: str
    running: int
    waiting: int
    jobs_per_s: float
    tokens_per_s: float


@dataclass
class BatchRow:
    record: BatchRecord
    completed: int
    failed: int

    @property
    def done(self) -> int:
        return self.completed + self.failed

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.record.total if self.record.total else 0.0


@dataclass
class View:
    status: QueueStatus | None
    workers: list[WorkerRow] = field(default_factory=list)
    batches: list[BatchRow] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    plot: str = ""  # SVG points of jobs/s over the last hour ("" : fewer than two samples)
    peak_per_s: float = 0.0
    taken_at: str = ""

    @property
    def percent(self) -> float:
        status = self.status
        return 100.0 * status.done / status.enqueued if status is not None and status.enqueued else 0.0


def read_view(client: redis.Redis, keys: QueueKeys, records: Records) -> View:
    queue = Client(client, keys.queue)
    status = read_status(client, keys) if queue.known() else None
    view = View(status=status, taken_at=time.strftime("%H:%M:%S"))
    for consumer in status.consumers if status is not None else []:
        beat = consumer.heartbeat
        model = (
            ", ".join(beat.served_models)
            if beat is not None and beat.served_models
            else (beat.model if beat else "")
        )
        view.workers.append(
            WorkerRow(
                name=consumer.name,
                alive=consumer.alive,
                heartbeat_age_s=consumer.heartbeat_age_s,
                model=model or "?",
                device=(beat.device if beat is not None else "") or "-",
                running=beat.running if beat is not None else consumer.in_flight,
                waiting=beat.waiting if beat is not None else 0,
                jobs_per_s=beat.jobs_per_s if beat is not None else 0.0,
                tokens_per_s=beat.tokens_per_s if beat is not None else 0.0,
            )
        )
    batches, _ = records.batches(None, BATCHES_SHOWN)
    counts = records.counts([b.id for b in batches if b.status not in FINAL])
    for batch in batches:
        completed, failed = (
            counts.get(batch.id, (0, 0)) if batch.status not in FINAL else (batch.completed, batch.failed)
        )
        view.batches.append(BatchRow(batch, completed, failed))
    view.dead = queue.dead_letters(count=DEAD_SHOWN)
    view.plot, view.peak_per_s = _plot(read_throughput(client, keys))
    return view


def _plot(samples: list[tuple[int, int, int]]) -> tuple[str, float]:
    """SVG polyline points of the completion rate between samples, over the last hour (or since
    the first sample), and its peak."""
    rates: list[tuple[int, float]] = []
    for (t0, done0, _), (t1, done1, _) in zip(samples, samples[1:], strict=False):
        if t1 > t0:
            rates.append((t1, max(0, done1 - done0) * 1000 / (t1 - t0)))
    if len(rates) < 2:
        return "", 0.0
    end_ms = rates[-1][0]
    start_ms = max(end_ms - 3_600_000, rates[0][0])  # NOTE: a queue younger than the hour fills the width
    span_ms = max(1, end_ms - start_ms)
    peak = max(rate for _, rate in rates) or 1.0
    points: list[Any] = []
    for at_ms, rate in rates:
        x = (at_ms - start_ms) * PLOT_W / span_ms
        y = PLOT_H - rate * (PLOT_H - 10) / peak
        points.append(f"{x:.1f},{y:.1f}")
    return " ".join(points), peak
