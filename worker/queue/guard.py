"""What a failed step of the worker loop means, and how long to wait before the next one.

    QueueUnavailable   (connection lost, LOADING, OOM at maxmemory, READONLY) back off and
                       retry; said once when the outage starts and once when it ends
    QueueLost          the consumer group is gone: Redis lost the queue (or it was deleted);
                       the consumer recreates it and checks what was lost
    QueueRefused       (password, ACL, TLS) propagates: the worker stops with its one line
    anything else      logged with its traceback, back off; after a few in a row, raised
GeneratorUnavailable propagates too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from worker.frontend.contract import GeneratorUnavailable
from worker.queue.jobqueue import QueueLost, QueueRefused, QueueUnavailable

log = logging.getLogger("radixq.worker")

MAX_UNEXPECTED = 5  # unexplained errors in a row before the loop gives up


class Guard:
    def __init__(
        self,
        max_backoff_s: float,
        wait: Callable[[float], None],
        on_group_lost: Callable[[], None],
        on_recovered: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_backoff_s = max_backoff_s
        self.wait = wait  # sleeps while still taking the generator's results
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
        except QueueLost as exc:
            log.error(
                "the consumer group is gone (%s): Redis lost the queue's data, or it was deleted; creating it again",
                exc,
            )
            self.on_group_lost()
            return False
        except QueueUnavailable as exc:
            if self.outage_since is None:
                self.outage_since = self.clock()
                log.warning("queue unavailable (%s); %d results wait in the outbox, retrying", exc, backlog)
            self._back_off(limit_s)
            return False
        except (GeneratorUnavailable, QueueRefused):
            raise
        except Exception:
            self._unexpected += 1
            log.exception("unexpected error in the worker loop (%d in a row)", self._unexpected)
            if self._unexpected >= MAX_UNEXPECTED:
                raise RuntimeError(
                    f"{self._unexpected} unexpected errors in a row in the worker loop; see the log"
                ) from None
            self._back_off(limit_s)
            return False
        if self.outage_since is not None:
            log.warning("queue is back after %.1f s", self.clock() - self.outage_since)
            self.outage_since = None
            self.on_recovered()
        self._backoff_s = 0.0
        self._unexpected = 0
        return True

    def _back_off(self, limit_s: float | None) -> None:
        self._backoff_s = min(self.max_backoff_s, max(0.05, self._backoff_s * 2))
        self.wait(self._backoff_s if limit_s is None else max(0.0, min(self._backoff_s, limit_s)))
