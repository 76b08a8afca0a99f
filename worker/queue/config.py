"""How a queue consumer behaves: timings, limits and its name. Built once, frozen."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from wire.keys import DEFAULT_QUEUE


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ConsumerConfig:
    queue: str = DEFAULT_QUEUE
    name: str = field(default_factory=default_worker_name)
    block_s: float = 1.0  # longest XREADGROUP wait while nothing is held
    poll_s: float = 0.02  # longest wait for backend results while jobs are held
    read_batch: int = 256  # most entries one XREADGROUP returns
    read_window: int = 0  # most jobs held at once; 0: two per slot of the generator (and a fair share)
    steal_after_s: float = 2.0  # a partition's backlog this old may be stolen by a dry worker
    survey_s: float = 0.5  # how often to read the queue's backlog and live workers (worker.queue.routing)
    min_idle_s: float = 60.0  # an entry pending this long without renewal is reclaimed
    max_attempts: int = 3  # deliveries (or crashes when run alone) before the dead-letter stream
    heartbeat_s: float = 2.0
    drain_timeout_s: float = 30.0  # SIGTERM to exit, all of it: finishing, giving back, stopping
    max_backoff_s: float = 5.0
    trim_jobs: bool = True  # trim acknowledged entries from the jobs stream
    housekeeping_s: float = 5.0  # how often to trim and to forget dead consumers

    def __post_init__(self) -> None:
        checks = [
            ("min_idle_s", self.min_idle_s > 0, "must be > 0"),
            ("max_attempts", self.max_attempts >= 1, "must be >= 1"),
            ("read_batch", self.read_batch >= 1, "must be >= 1"),
            (
                "read_window",
                self.read_window >= 0,
                "must be >= 0 (0: two per slot of the engine)",
            ),
            ("survey_s", self.survey_s > 0, "must be > 0"),
            ("steal_after_s", self.steal_after_s >= 0, "must be >= 0"),
            ("drain_timeout_s", self.drain_timeout_s >= 0, "must be >= 0"),
            ("heartbeat_s", self.heartbeat_s >= 0, "must be >= 0 (0: every step)"),
            ("block_s", self.block_s >= 0, "must be >= 0"),
            ("poll_s", self.poll_s >= 0, "must be >= 0"),
        ]
        for name, ok, reason in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: {reason}")

    @property
    def min_idle_ms(self) -> int:
        return int(self.min_idle_s * 1000)

    @property
    def renew_every_s(self) -> float:
        """Leases are renewed three times per min-idle period, so a live job is never idle enough."""
        return self.min_idle_s / 3

    @property
    def reclaim_every_s(self) -> float:
        return min(self.min_idle_s / 2, 5.0)

    @property
    def dead_after_ms(self) -> int:
        """A consumer silent this long (no command, no heartbeat) and holding nothing is forgotten."""
        return int(max(self.min_idle_s, 10 * self.heartbeat_s) * 1000)
