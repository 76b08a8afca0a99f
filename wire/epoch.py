"""A queue knows what it was given: an epoch token written once, watched by long-lived clients.

The first enqueue (or ``dlq requeue``) writes a random ``epoch`` into the queue's meta hash with
HSETNX. Workers and collectors remember the epoch they first saw. If Redis later answers
without it (restarted without its data) or with another one (lost it, then a new enqueue),
the queue's bookkeeping is no longer what it was: the watcher says so, once per change.
Only producers write the epoch; a worker or collector never recreates it, which would hide
the loss.
"""

from __future__ import annotations

import secrets
from typing import Any

import redis

from wire.keys import META_CREATED_MS, META_EPOCH, QueueKeys
from wire.status import now_ms


def create_epoch(client: redis.Redis, keys: QueueKeys) -> str:
    """The queue's epoch, written now if it has none."""
    token = secrets.token_hex(8)
    with client.pipeline(transaction=True) as pipe:
        pipe.hsetnx(keys.meta, META_EPOCH, token)
        pipe.hsetnx(keys.meta, META_CREATED_MS, now_ms())
        pipe.hget(keys.meta, META_EPOCH)
        reply: Any = pipe.execute()
    return reply[-1].decode()


def read_epoch(client: redis.Redis, keys: QueueKeys) -> str | None:
    value: Any = client.hget(keys.meta, META_EPOCH)
    return value.decode() if value is not None else None


class EpochWatch:
    """Remembers the first epoch seen; ``check`` reports a loss once per change."""

    def __init__(self, keys: QueueKeys) -> None:
        self.keys = keys
        self.epoch: str | None = None
        self.losses = 0

    def check(self, client: redis.Redis) -> str | None:
        """None while the epoch is the one first seen (or none was ever seen); else a line
        that says what was lost. The new state is adopted, so the next call is quiet."""
        return self.observe(read_epoch(client, self.keys))

    def observe(self, current: str | None) -> str | None:
        if current == self.epoch:
            return None
        previous, self.epoch = self.epoch, current
        if previous is None:
            return None
        self.losses += 1
        queue = self.keys.queue
        if current is None:
            return (
                f"queue {queue!r}: Redis no longer knows this queue (epoch {previous} is gone): it was "
                "restarted without its data or the keys were deleted; jobs and results may be lost. "
                "Re-enqueue the input file and collect again into the same output."
            )
        return (
            f"queue {queue!r}: Redis lost this queue's data (epoch {previous} was replaced by {current}); "
            "jobs enqueued before may be lost. Re-enqueue the input file and collect again into the same output."
        )
