"""What a failed step of the worker loop means, and how long to wait before the next one.

    transient Redis error   (connection lost, LOADING, OOM at maxmemory, READONLY) back off and
                            retry; said once when the outage starts and once when it ends
    NOGROUP                 the group is gone: Redis lost the queue (or it was deleted); the
                            consumer recreates it and checks what it lost
    fatal Redis error       (password, ACL, TLS) FatalRedisError with the one line to show
    anything else           logged with its traceback, back off; after a few in a row, raised
BackendUnavailable and FatalRedisError always propagate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from producer.redis_errors import FatalRedisError, classify, describe
from worker.queue.backend import BackendUnavailable

log = logging.getLogger("radixq.worker")

MAX_UNEXPECTED = 5  # unexplained errors in a row before the loop gives up


class Guard:
    def __init__(
        self,
        url: str,
        max_backoff_s: float,
        wait: Callable[[float], None],
        on_group_lost: Callable[[], None],
        on_recovered: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.max_backoff_s = max_backoff_s
        self.wait = wait  # sleeps while still taking the backend's results
        self.on_group_lost = on_group_lost
        self.on_recovered = on_recovered
        self.clock = clock
        self.outage_since: float | None = None
        self._backoff_s = 0.0
        self._unexpected = 0

    def run(self, action: Callable[[], object], limit_s: float | None = None, backlog: int = 0) -> bool:
        """``action()``; False after a failure it waited out (at most ``limit_s``). ``backlog``:
        results waiting to be written, for the outage message."""
        try:
            action()
        except redis.RedisError as exc:
            kind = classify(exc)
            if kind == "fatal":
                raise FatalRedisError(describe(exc, self.url)) from None
            if "NOGROUP" in str(exc):
                log.error(
                    "the consumer group is gone (Redis lost the queue's data, or it was deleted); "
                    "creating it again"
                )
                self.on_group_lost()
                return False
            if kind == "transient":
                if self.outage_since is None:
                    self.outage_since = self.clock()
                    log.warning(
                        "redis unavailable (%s); %d results wait in the outbox, retrying",
                        describe(exc, self.url),
                        backlog,
                    )
            else:
                self._unexpected_error()
            self._back_off(limit_s)
            return False
        except (BackendUnavailable, FatalRedisError):
            raise
        except Exception:
            self._unexpected_error()
            self._back_off(limit_s)
            return False
        if self.outage_since is not None:
            log.warning("redis is back after %.1f s", self.clock() - self.outage_since)
            self.outage_since = None
            self.on_recovered()
        self._backoff_s = 0.0
        self._unexpected = 0
        return True

    def _unexpected_error(self) -> None:
        self._unexpected += 1
        log.exception("unexpected error in the worker loop (%d in a row)", self._unexpected)
        if self._unexpected >= MAX_UNEXPECTED:
            raise RuntimeError(
                f"{self._unexpected} unexpected errors in a row in the worker loop; see the log"
            )

    def _back_off(self, limit_s: float | None) -> None:
        self._backoff_s = min(self.max_backoff_s, max(0.05, self._backoff_s * 2))
        self.wait(self._backoff_s if limit_s is None else max(0.0, min(self._backoff_s, limit_s)))
