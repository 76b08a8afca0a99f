"""Pending entries: taking over those of dead consumers, keeping our own alive.

A consumer that holds an entry renews its lease (XCLAIM ... JUSTID to itself, which resets
the idle time without counting a delivery) every ``min_idle / 3``. An entry idle for longer
than ``min_idle`` therefore belongs to a consumer that stopped; XAUTOCLAIM moves it to us and
counts one more delivery, which the dead-letter rule reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from producer.keys import QueueKeys


@dataclass(frozen=True)
class Claimed:
    entry_id: str
    fields: dict[bytes, bytes]
    deliveries: int  # including the one that just gave it to us


class Reclaimer:
    def __init__(self, keys: QueueKeys, name: str, min_idle_ms: int) -> None:
        self.keys = keys
        self.name = name
        self.min_idle_ms = min_idle_ms
        self._cursor = "0-0"

    def claim(self, client: redis.Redis, count: int) -> list[Claimed]:
        """Take over up to ``count`` entries idle for at least min_idle (one XAUTOCLAIM scan step)."""
        reply = client.xautoclaim(
            self.keys.jobs, self.keys.group, self.name, self.min_idle_ms, start_id=self._cursor, count=count
        )
        cursor, entries = reply[0], reply[1]
        self._cursor = cursor.decode() if isinstance(cursor, bytes) else cursor
        entries = [(entry_id, fields) for entry_id, fields in entries if fields]  # deleted entries: no body
        if not entries:
            return []
        with client.pipeline(transaction=False) as pipe:
            for entry_id, _ in entries:
                pipe.xpending_range(self.keys.jobs, self.keys.group, min=entry_id, max=entry_id, count=1)
            pending = pipe.execute()
        claimed = []
        for (entry_id, fields), info in zip(entries, pending, strict=True):
            deliveries = int(info[0]["times_delivered"]) if info else 1
            claimed.append(Claimed(entry_id.decode(), fields, deliveries))
        return claimed

    def renew(self, client: redis.Redis, entry_ids: list[str]) -> set[str]:
        """Reset the idle time of those ``entry_ids`` we still own; returns the ones we lost."""
        if not entry_ids:
            return set()
        owned_info = client.xpending_range(
            self.keys.jobs,
            self.keys.group,
            min="-",
            max="+",
            count=len(entry_ids) + 1024,
            consumername=self.name,
        )
        owned = {info["message_id"].decode() for info in owned_info}
        keep = [entry_id for entry_id in entry_ids if entry_id in owned]
        if keep:
            client.xclaim(self.keys.jobs, self.keys.group, self.name, 0, keep, justid=True)
        return set(entry_ids) - owned
