"""How either side opens Redis, and the consumer groups a queue's streams need."""

from __future__ import annotations

import redis

from wire import cluster
from wire.keys import QueueKeys


def connect(url: str) -> redis.Redis:
    """A client with the timeouts radixq expects (bytes replies, health checks, no retries
    inside redis-py): a cluster client when ``url`` names a Redis Cluster node (wire.cluster)."""
    return cluster.connect(url)


def ensure_groups(client: redis.Redis, keys: QueueKeys, partitions: int = 1) -> None:
    """Create the partition streams and their consumer groups (reading from the start) if missing."""
    for stream in keys.partitions(partitions):
        try:
            client.xgroup_create(stream, keys.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
