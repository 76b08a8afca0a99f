"""How either side opens Redis, and the consumer groups a queue's streams need."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from wire.keys import QueueKeys


def connect(url: str) -> redis.Redis:
    """A client with the timeouts radixq expects (bytes replies, health checks).

    NOTE: no retries inside redis-py (its default backs off for seconds and re-sends a
    MULTI/EXEC whose reply was lost): every caller retries at its own level, knowing what a
    repeated step means."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=5,
        socket_keepalive=True,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 0),
    )


def ensure_groups(client: redis.Redis, keys: QueueKeys, partitions: int = 1) -> None:
    """Create the partition streams and their consumer groups (reading from the start) if missing."""
    for stream in keys.partitions(partitions):
        try:
            client.xgroup_create(stream, keys.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
