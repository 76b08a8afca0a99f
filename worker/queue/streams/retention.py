"""Keeping the jobs stream and the consumer list from growing without end.

Trimming: an entry every worker has acknowledged is no longer needed (its result and ``done``
mark hold what counts; a dead letter carries its own copy of the job). The stream is trimmed
below the oldest entry still needed: the oldest pending one, or the first never delivered.
Redis's XTRIM MINID knows nothing of pending entries, so the bound is computed here.

    NOTE: the group's last-delivered id is read BEFORE the pending summary. An entry delivered
    in between has an id above the last-delivered id read, so it stays; reading them the other
    way round could trim an entry delivered (and pending) in between.

Forgetting: a consumer that holds nothing, has not been seen for ``dead_after_ms`` and wrote
no heartbeat for as long is deleted from the group with its heartbeat (atomically, in a
script that checks again that it holds nothing; on a cluster, a partition stream outside the
queue's slot is left in the script and the heartbeat deleted right after).
"""

from __future__ import annotations

from typing import Any

import redis

from wire.cluster import together
from wire.keys import QueueKeys
from wire.status import decode_heartbeat, now_ms

_FORGET = """
local held = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
if KEYS[2] then redis.call('HDEL', KEYS[2], ARGV[2]) end
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def trim_acked_jobs(client: redis.Redis, keys: QueueKeys, stream: str | None = None) -> int:
    """Remove acknowledged entries from a partition stream (default: partition 0, ``jobs``);
    returns how many went."""
    stream = stream or keys.jobs
    if not client.exists(stream):
        return 0
    groups: Any = client.xinfo_groups(stream)
    group = next((g for g in groups if _text(g["name"]) == keys.group), None)
    if group is None:
        return 0
    ms, seq = _parse_id(_text(group["last-delivered-id"]))
    bound = (ms, seq + 1)  # everything up to the last delivered one, if nothing older is pending
    summary: Any = client.xpending(stream, keys.group)
    if summary["pending"]:
        bound = min(bound, _parse_id(_text(summary["min"])))
    if bound <= (0, 1):
        return 0
    return int(client.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=False))


class ConsumerJanitor:
    """Deletes consumers that died holding nothing (see the module docstring)."""

    def __init__(self, keys: QueueKeys, name: str, dead_after_ms: int) -> None:
        self.keys = keys
        self.name = name
        self.dead_after_ms = dead_after_ms
        self._script: Any = None

    def sweep(self, client: redis.Redis, streams: list[str]) -> list[str]:
        """Forget, in each partition stream's group, the dead consumers holding nothing there."""
        if self._script is None:
            self._script = client.register_script(_FORGET)
        streams = [stream for stream in streams if client.exists(stream)]
        if not streams:
            return []
        beats: Any = client.hgetall(self.keys.workers)
        now = now_ms()

        def silent(name: str) -> bool:
            beat = decode_heartbeat(beats[name.encode()]) if name.encode() in beats else None
            return beat is None or now - beat.last_seen_ms > self.dead_after_ms

        forgotten: set[str] = set()
        listed = set()
        for stream in streams:
            consumers: Any = client.xinfo_consumers(stream, self.keys.group)
            for consumer in consumers:
                name = _text(consumer["name"])
                listed.add(name)
                if (
                    name == self.name
                    or int(consumer["pending"])
                    or int(consumer["idle"]) < self.dead_after_ms
                ):
                    continue
                # NOTE: on a cluster, a partition outside the queue's slot: its heartbeat goes after
                keys = [stream, self.keys.workers]
                if not together(client, keys):
                    keys = [stream]
                if silent(name) and self._script(keys=keys, args=[self.keys.group, name]):
                    forgotten.add(name)
                    if len(keys) == 1:
                        client.hdel(self.keys.workers, name)
        stale = [
            _text(n) for n in beats if _text(n) not in listed and _text(n) != self.name and silent(_text(n))
        ]
        if stale:
            client.hdel(self.keys.workers, *stale)
        return sorted(forgotten) + stale
