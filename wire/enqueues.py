"""An enqueue that finished: what a collect started beside its producers waits for.

``radixq enqueue FILE`` adds 1 to the queue's meta ``enqueues_finished`` once every row of FILE
is in (rejected rows included, as their error results); an enqueue that stopped early adds
nothing. ``collect --expect-enqueues K`` waits until K enqueues have finished and every id
enqueued is written, so it can start before (or beside) producers whose row counts it does not
know.
"""

from __future__ import annotations

from typing import Any

import redis

from wire.keys import META_ENQUEUES_FINISHED, QueueKeys


def finish_enqueue(client: redis.Redis, keys: QueueKeys) -> int:
    """Count one finished enqueue; returns how many have finished on the queue."""
    count: Any = client.hincrby(keys.meta, META_ENQUEUES_FINISHED, 1)
    return int(count)


def enqueues_finished(raw: bytes | str | None) -> int:
    """The count as read from the meta hash (absent: none finished yet)."""
    return int(raw or 0)
