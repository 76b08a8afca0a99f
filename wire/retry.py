"""Waiting out transient Redis errors on the producer side (enqueue, collect, dlq requeue).

A ``Backoff`` runs one Redis step; a transient error (wire.redis_errors.classify) is
retried with exponential backoff until ``give_up_s`` pass without a successful step (or
``stop`` says to give up), then ``RedisUnavailable`` is raised with the last error; a Redis
that never answered (a wrong URL, a server not started) is reported at once, unless the caller
set ``reached`` (collect waits for a Redis that is starting). Fatal and other errors propagate
at once. The outage is reported once through ``say`` when it starts and once when Redis
answers again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis

from wire.redis_errors import classify, describe

T = TypeVar("T")


class RedisUnavailable(Exception):
    """Redis stayed unavailable (transient errors only) for longer than the retry timeout."""

    def __init__(self, cause: redis.RedisError, waited_s: float) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.waited_s = waited_s


class Backoff:
    """Retries transient Redis errors; ``give_up_s`` bounds the time spent without progress."""

    def __init__(
        self,
        url: str,
        *,
        give_up_s: float = 60.0,
        say: Callable[[str], None] | None = None,
        first_wait_s: float = 0.05,
        max_wait_s: float = 2.0,
    ) -> None:
        self.url = url
        self.give_up_s = give_up_s
        self.say = say
        self.first_wait_s = first_wait_s
        self.max_wait_s = max_wait_s
        self.outages = 0
        self.reached = False  # whether Redis ever answered: before that, "refused" is a wrong URL
        self.stop: Callable[[], bool] | None = None  # asked between tries: give up now (a signal)
        self._down_since: float | None = None  # monotonic time of the first failure of this outage
        self._wait_s = first_wait_s

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def call(self, step: Callable[[], T], deadline: float | None = None) -> T:
        """``step()``, retried through transient errors (not past ``deadline``, monotonic)."""
        while True:
            try:
                value = step()
            except redis.RedisError as exc:
                if classify(exc) != "transient":
                    raise
                self.failed(exc, deadline)
                continue
            self.recovered()
            return value

    def failed(self, exc: redis.RedisError, deadline: float | None = None) -> None:
        """Note a transient failure and sleep before the next try; raises RedisUnavailable when
        the outage has lasted ``give_up_s`` (or ``deadline`` has passed)."""
        now = time.monotonic()
        if (
            not self.reached
            and isinstance(exc, redis.ConnectionError)
            and not isinstance(exc, redis.BusyLoadingError)
        ):
            raise RedisUnavailable(exc, 0.0) from exc  # never reached: say so now, not after give_up_s
        if self._down_since is None:
            self._down_since = now
            self.outages += 1
            if self.say is not None and self.give_up_s > 0:
                self.say(f"waiting for Redis (up to {self.give_up_s:g} s): {describe(exc, self.url)}")
        waited_s = now - self._down_since
        stopping = self.stop is not None and self.stop()
        if waited_s >= self.give_up_s or (deadline is not None and now >= deadline) or stopping:
            raise RedisUnavailable(exc, waited_s) from exc
        pause_s = min(self._wait_s, self.give_up_s - waited_s)
        if deadline is not None:
            pause_s = min(pause_s, max(0.0, deadline - now))
        time.sleep(pause_s)
        self._wait_s = min(self._wait_s * 2, self.max_wait_s)

    def recovered(self) -> None:
        """A step succeeded: the no-progress clock starts again at the next failure."""
        self.reached = True
        if self._down_since is not None and self.say is not None and self.give_up_s > 0:
            self.say(f"Redis answers again after {time.monotonic() - self._down_since:.1f} s")
        self._down_since = None
        self._wait_s = self.first_wait_s
