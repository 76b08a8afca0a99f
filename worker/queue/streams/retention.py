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
script that checks again that it holds nothing).
"""

from __future__ import annotations

from typing import Any

import redis

from producer.keys import QueueKeys
from producer.status import decode_heartbeat, now_ms

_FORGET = """
local held = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def trim_acked_jobs(client: redis.Redis, keys: QueueKeys) -> int:
    """Remove acknowledged entries from the jobs stream; returns how many went."""
    if not client.exists(keys.jobs):
        return 0
    groups: Any = client.xinfo_groups(keys.jobs)
    group = next((g for g in groups if _text(g["name"]) == keys.group), None)
    if group is None:
        return 0
    ms, seq = _parse_id(_text(group["last-delivered-id"]))
    bound = (ms, seq + 1)  # everything up to the last delivered one, if nothing older is pending
    summary: Any = client.xpending(keys.jobs, keys.group)
    if summary["pending"]:
        bound = min(bound, _parse_id(_text(summary["min"])))
    if bound <= (0, 1):
        return 0
    return int(client.xtrim(keys.jobs, minid=f"{bound[0]}-{bound[1]}", approximate=False))


class ConsumerJanitor:
    """Deletes consumers that died holding nothing (see the module docstring)."""

    def __init__(self, keys: QueueKeys, name: str, dead_after_ms: int) -> None:
        self.keys = keys
        self.name = name
        self.dead_after_ms = dead_after_ms
        self._script: Any = None

    def sweep(self, client: redis.Redis) -> list[str]:
        if self._script is None:
            self._script = client.register_script(_FORGET)
        if not client.exists(self.keys.jobs):
            return []
        consumers: Any = client.xinfo_consumers(self.keys.jobs, self.keys.group)
        beats: Any = client.hgetall(self.keys.workers)
        now = now_ms()

        def silent(name: str) -> bool:
            beat = decode_heartbeat(beats[name.encode()]) if name.encode() in beats else None
            return beat is None or now - beat.last_seen_ms > self.dead_after_ms

        forgotten = []
        listed = set()
        for consumer in consumers:
            name = _text(consumer["name"])
            listed.add(name)
            if name == self.name or int(consumer["pending"]) or int(consumer["idle"]) < self.dead_after_ms:
                continue
            if silent(name) and self._script(
                keys=[self.keys.jobs, self.keys.workers], args=[self.keys.group, name]
            ):
                forgotten.append(name)
        stale = [
            _text(n) for n in beats if _text(n) not in listed and _text(n) != self.name and silent(_text(n))
        ]
        if stale:
            client.hdel(self.keys.workers, *stale)
        return forgotten + stale
