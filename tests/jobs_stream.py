"""A queue's jobs as tests read them straight from Redis: over every partition stream.

A new queue routes by default (wire.routing: DEFAULT_PARTITIONS streams), so a test that
looks for a job's entry reads them all; the ids are qualified (``p/ms-seq`` for p > 0) as
workers write them in results, done marks and acks.
"""

from __future__ import annotations

from typing import Any

from wire.keys import QueueKeys
from wire.routing import qualify, read_routing, split_id


def job_entries(client: Any, keys: QueueKeys | None = None) -> list[tuple[str, dict[bytes, bytes]]]:
    """(qualified entry id, fields) of every entry, partition by partition, oldest first."""
    keys = keys or QueueKeys()
    partitions = read_routing(client, keys)[0]
    return [
        (qualify(p, (e.decode() if isinstance(e, bytes) else e)), fields)
        for p in range(partitions)
        for e, fields in client.xrange(keys.partition(p))
    ]


def newest_entries(client: Any, keys: QueueKeys | None = None) -> dict[str, str]:
    """Job id -> its newest entry (a job's entries share one partition: its prefix key's)."""
    return {fields[b"id"].decode(): entry for entry, fields in job_entries(client, keys)}


def entry_fields(client: Any, entry_id: str, keys: QueueKeys | None = None) -> dict[bytes, bytes]:
    keys = keys or QueueKeys()
    partition, raw = split_id(entry_id)
    return dict(client.xrange(keys.partition(partition), raw, raw)[0][1])


def stream_of(entry_id: str, keys: QueueKeys | None = None) -> tuple[str, str]:
    """(the partition stream, the stream's own id) of a qualified entry id."""
    keys = keys or QueueKeys()
    partition, raw = split_id(entry_id)
    return keys.partition(partition), raw


def total_len(client: Any, keys: QueueKeys | None = None) -> int:
    keys = keys or QueueKeys()
    partitions = read_routing(client, keys)[0]
    return sum(client.xlen(keys.partition(p)) for p in range(partitions))


def pending_count(client: Any, keys: QueueKeys | None = None) -> int:
    """Entries delivered and not acknowledged, over the partitions."""
    keys = keys or QueueKeys()
    partitions = read_routing(client, keys)[0]
    return sum(
        int(client.xpending(keys.partition(p), keys.group)["pending"])
        for p in range(partitions)
        if client.exists(keys.partition(p))
    )


def consumer_names(client: Any, keys: QueueKeys | None = None) -> set[bytes]:
    """Names of the group's consumers in any partition."""
    keys = keys or QueueKeys()
    partitions = read_routing(client, keys)[0]
    return {
        c["name"]
        for p in range(partitions)
        if client.exists(keys.partition(p))
        for c in client.xinfo_consumers(keys.partition(p), keys.group)
    }


def pending_entries(
    client: Any, keys: QueueKeys | None = None, consumer: str | None = None, count: int = 10_000
) -> list[dict[str, Any]]:
    """XPENDING's entries over the partitions (``message_id`` qualified), of one consumer if named."""
    keys = keys or QueueKeys()
    partitions = read_routing(client, keys)[0]
    found = []
    for p in range(partitions):
        if not client.exists(keys.partition(p)):
            continue
        for info in client.xpending_range(keys.partition(p), keys.group, "-", "+", count, consumer):
            raw = info["message_id"]
            found.append({**info, "message_id": qualify(p, raw.decode() if isinstance(raw, bytes) else raw)})
    return found
