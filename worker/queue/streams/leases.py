"""Pending entries: taking over those of dead consumers, keeping our own alive.

A consumer that holds an entry renews its lease (XCLAIM ... JUSTID to itself, which resets
the idle time without counting a delivery) every ``min_idle / 3``. An entry idle for longer
than ``min_idle`` therefore belongs to a consumer that stopped; XAUTOCLAIM moves it to us and
counts one more delivery, which the dead-letter rule reads. A job that crashed the engine when
it ran alone counts one more delivery the same way (``count_attempt``). Each call works on one
partition stream; ids here are that stream's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from wire.keys import QueueKeys


@dataclass(frozen=True)
class Claimed:
    entry_id: str
    fields: dict[bytes, bytes]
    deliveries: int  # including the one that just gave it to us


# Count one more delivery of an entry this consumer holds: -1 when it is not (or no longer) ours.
_COUNT_ATTEMPT = """
local info = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #info == 0 or info[1][2] ~= ARGV[2] then return -1 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
return info[1][4] + 1
"""


class Leases:
    def __init__(self, keys: QueueKeys, name: str, min_idle_ms: int) -> None:
        self.keys = keys
        self.name = name
        self.min_idle_ms = min_idle_ms
        self._cursors: dict[str, str] = {}
        self._count_script: Any = None

    def count_attempt(self, client: redis.Redis, stream: str, entry_id: str) -> int | None:
        """One more delivery of ``entry_id`` (held by us); returns its count, None if not ours."""
        if self._count_script is None:
            self._count_script = client.register_script(_COUNT_ATTEMPT)
        count = int(self._count_script(keys=[stream], args=[self.keys.group, self.name, entry_id]))
        return count if count >= 0 else None

    def claim(self, client: redis.Redis, stream: str, count: int) -> list[Claimed]:
        """Take over up to ``count`` entries idle for at least min_idle (one XAUTOCLAIM scan step)."""
        reply = client.xautoclaim(
            stream,
            self.keys.group,
            self.name,
            self.min_idle_ms,
            start_id=self._cursors.get(stream, "0-0"),
            count=count,
        )
        cursor, entries = reply[0], reply[1]
        self._cursors[stream] = cursor.decode() if isinstance(cursor, bytes) else cursor
        entries = [(entry_id, fields) for entry_id, fields in entries if fields]  # deleted entries: no body
        if not entries:
            return []
        with client.pipeline(transaction=False) as pipe:
            for entry_id, _ in entries:
                pipe.xpending_range(stream, self.keys.group, min=entry_id, max=entry_id, count=1)
            pending = pipe.execute()
        claimed = []
        for (entry_id, fields), info in zip(entries, pending, strict=True):
            deliveries = int(info[0]["times_delivered"]) if info else 1
            claimed.append(Claimed(entry_id.decode(), fields, deliveries))
        return claimed

    def renew(self, client: redis.Redis, stream: str, entry_ids: list[str]) -> set[str]:
        """Reset the idle time of those ``entry_ids`` we still own; returns the ones we lost."""
        if not entry_ids:
            return set()
        owned_info: Any = client.xpending_range(
            stream, self.keys.group, min="-", max="+", count=len(entry_ids) + 1024, consumername=self.name
        )
        owned = {info["message_id"].decode() for info in owned_info}
        keep: list[Any] = [entry_id for entry_id in entry_ids if entry_id in owned]
        if keep:
            client.xclaim(stream, self.keys.group, self.name, 0, keep, justid=True)
        return set(entry_ids) - owned
