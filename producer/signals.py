"""SIGINT and SIGTERM counted instead of acted upon, for commands that stop between steps.

``collect`` and ``run`` look at the count between their steps: a collect writes what it read
and releases its lock, a run drains its workers. Only the main thread can catch signals;
elsewhere nothing is installed (the count stays 0).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Signals:
    count = 0
    first: int | None = None  # the first signal's number

    @property
    def exit_code(self) -> int:
        """What a shell reports for a command ended by the first signal: 128 + its number."""
        return 128 + (self.first or signal.SIGINT)


@contextmanager
def signals_counted() -> Iterator[Signals]:
    signals = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return

    def count(signum: int, frame: object) -> None:
        signals.count += 1
        signals.first = signals.first or signum

    previous = {signum: signal.signal(signum, count) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
