"""An in-memory SchedulerIO, for tests and the offline API (same thread or another)."""

from __future__ import annotations

import queue

from worker.scheduler.messages import Inbound, Outbound


class InMemoryIO:
    """Implements worker.scheduler.messages.SchedulerIO over two thread-safe queues."""

    def __init__(self) -> None:
        self.inbound: queue.Queue[Inbound] = queue.Queue()
        self.outbound: queue.Queue[Outbound] = queue.Queue()

    def put(self, message: Inbound) -> None:
        """Front-end side: hand the scheduler a message."""
        self.inbound.put(message)

    def take_all(self) -> list[Outbound]:
        """Front-end side: every message the scheduler has sent so far."""
        out: list[Outbound] = []
        while True:
            try:
                out.append(self.outbound.get_nowait())
            except queue.Empty:
                return out

    def receive(self, block: bool) -> list[Inbound]:
        messages: list[Inbound] = []
        if block:
            messages.append(self.inbound.get())
        while True:
            try:
                messages.append(self.inbound.get_nowait())
            except queue.Empty:
                return messages

    def send(self, messages: list[Outbound]) -> None:
        for message in messages:
            self.outbound.put(message)
