"""How a queue consumer behaves (the ``[queue]`` table): timings, limits and its name. Built
once, frozen; each setting declared once (worker.options)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from wire.keys import DEFAULT_QUEUE
from worker.options import above, at_least, check_options, option
from worker.queue.routing import STEAL_AFTER_S


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ConsumerConfig:
    queue: str = DEFAULT_QUEUE
    name: str = field(default_factory=default_worker_name)
    block_s: float = option(1.0, "longest wait for new entries while nothing is held", check=at_least(0))
    poll_s: float = option(0.02, "longest wait for results while jobs are held", check=at_least(0))
    read_batch: int = option(256, "most entries one read returns", check=at_least(1))
    read_window: int = option(
        0,
        "most jobs held at once (0: two per running slot of the engine; never more than the engine takes, "
        "8 per slot, nor than a fair share of the queue's jobs over the live workers)",
        check=at_least(0, "0: two per slot of the engine"),
    )
    steal_after_s: float = option(
        STEAL_AFTER_S,
        "a partition's backlog must be this old before a worker that ran dry steals from it (its owner first)",
        check=at_least(0),
    )
    survey_s: float = option(
        0.5,
        "how old the pool's survey of the backlog, live workers and partition owners may be (one worker "
        "takes it for all; a worker reads it when it has room)",
        check=above(0),
    )
    min_idle_s: float = option(
        60.0,
        "an entry idle this long belongs to a dead worker and is reclaimed",
        check=above(0),
    )
    max_attempts: int = option(
        3,
        "deliveries (or crashes of the engine while run alone) before the dead-letter stream",
        check=at_least(1),
    )
    heartbeat_s: float = option(
        2.0,
        "how often the worker writes its heartbeat",
        check=at_least(0, "0: every step"),
    )
    drain_timeout_s: float = option(
        30.0,
        "SIGTERM to exit, all of it: finishing, giving back, stopping",
        check=at_least(0),
    )
    max_backoff_s: float = option(5.0, "longest wait between tries while Redis is unavailable")
    trim_jobs: bool = option(
        True, "trim acknowledged entries from the jobs stream", flags=("--trim-jobs/--keep-jobs",)
    )
    housekeeping_s: float = option(
        5.0,
        "how often the pool trims acknowledged entries and forgets dead consumers (a worker of W: every W x this)",
    )

    def __post_init__(self) -> None:
        check_options(self)

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
