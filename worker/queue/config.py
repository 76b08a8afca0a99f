"""How a queue consumer behaves: timings, limits and its name. Built once, frozen."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from producer.keys import DEFAULT_QUEUE


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ConsumerConfig:
    queue: str = DEFAULT_QUEUE
    name: str = field(default_factory=default_worker_name)
    block_s: float = 1.0  # longest XREADGROUP wait while nothing is held
    poll_s: float = 0.02  # longest wait for backend results while jobs are held
    read_batch: int = 256  # most entries one XREADGROUP returns
    min_idle_s: float = 60.0  # an entry pending this long without renewal is reclaimed
    max_attempts: int = 3  # deliveries allowed before the dead-letter stream
    heartbeat_s: float = 2.0
    drain_timeout_s: float = 30.0
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.min_idle_s <= 0 or self.max_attempts < 1 or self.read_batch < 1:
            raise ValueError(f"invalid consumer config: {self}")

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
