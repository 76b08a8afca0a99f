"""What a worker tells the queue, and what it checks the queue still knows.

Every heartbeat writes the worker's Heartbeat and reads the queue's epoch (one round trip):
an epoch that disappears or changes means Redis lost the queue's data (producer.epoch). After
an outage or a lost group, the jobs stream must still reach the newest entry this worker read:
a Redis restarted without its data, or from an AOF that missed the last writes, does not.
Either is logged as DATA LOSS with what to do, and counted in the heartbeat.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import redis

from producer.epoch import EpochWatch
from producer.keys import META_EPOCH, QueueKeys
from producer.status import Heartbeat

log = logging.getLogger("radixq.worker")


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a comparable (ms, seq)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class QueueWatch:
    def __init__(self, keys: QueueKeys, name: str) -> None:
        self.keys = keys
        self.name = name
        self.epoch = EpochWatch(keys)
        self.stream_losses = 0
        self.last_read = (0, 0)  # the newest jobs-stream entry this worker received

    @property
    def losses(self) -> int:
        return self.epoch.losses + self.stream_losses

    def saw(self, entry_id: str) -> None:
        self.last_read = max(self.last_read, entry_key(entry_id))

    def beat(self, client: redis.Redis, heartbeat: Heartbeat) -> None:
        """Write the heartbeat; report a changed epoch."""
        with client.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.workers, self.name, msgspec.msgpack.encode(heartbeat))
            pipe.hget(self.keys.meta, META_EPOCH)
            reply: Any = pipe.execute()
        epoch = reply[1]
        lost = self.epoch.observe(epoch.decode() if epoch is not None else None)
        if lost is not None:
            log.error("DATA LOSS: %s", lost)

    def check_stream(self, client: redis.Redis) -> None:
        """Report a jobs stream that no longer reaches the newest entry this worker read."""
        if self.last_read == (0, 0):
            return
        try:
            info: Any = client.xinfo_stream(self.keys.jobs)
            last = entry_key(info["last-generated-id"].decode())
        except redis.ResponseError:  # no such key
            last = (0, 0)
        if last < self.last_read:
            self.stream_losses += 1
            log.error(
                "DATA LOSS: queue %r: Redis answers with jobs up to entry %d-%d, but this worker had read "
                "entry %d-%d: it lost recent writes (restarted without its data, or from an older AOF). "
                "Re-enqueue the input file and collect again into the same output.",
                self.keys.queue,
                *last,
                *self.last_read,
            )
