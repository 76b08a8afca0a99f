"""Whether anything consumes the queue while a collect waits for its results.

A collect that waits on a queue no worker reads would otherwise show ``0/80 done ... ETA ?``
for as long as it is left running. The watch looks at the queue's consumers every
``CHECK_EVERY_S`` (wire.status.live_consumers: heartbeats and reads, as ``status`` judges them)
and says once, when none has been alive for ``GRACE_S``, that nothing consumes the queue; it
says it again only after a worker has come and gone again. With the workers' heartbeat every
2 s and a worker dead after 5 missed beats, a pool that dies is reported within about 25 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from wire.keys import QueueKeys
from wire.status import live_consumers

GRACE_S = 10.0  # waited this long with no live worker: worth a line
CHECK_EVERY_S = 5.0


class ConsumerWatch:
    def __init__(
        self,
        client: redis.Redis,
        keys: QueueKeys,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.keys = keys
        self.say = say
        self.clock = clock
        self._alive_at = clock()  # when a live consumer was last seen (or the watch began)
        self._next_check = self._alive_at
        self._said = False

    def check(self) -> None:
        """Call while waiting; reads Redis at most every CHECK_EVERY_S."""
        now = self.clock()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        try:
            live = live_consumers(self.client, self.keys)
        except redis.RedisError:
            return  # NOTE: an outage is the collect's own Redis calls' to wait out and report
        if live:
            self._alive_at, self._said = now, False
        elif not self._said and now - self._alive_at >= GRACE_S:
            self._said = True
            queue = self.keys.queue
            self.say(
                f"no worker is consuming queue {queue!r} (none has sent a heartbeat or read for "
                f"{now - self._alive_at:.0f} s): start one (radixq worker --queue {queue}), or stop "
                "this collect with Ctrl-C (what it has read is kept)"
            )
