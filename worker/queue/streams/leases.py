"""Pending entries: taking over those of dead consumers, keeping our own alive.

A consumer that holds an entry renews its lease (XCLAIM ... JUSTID to itself, which resets
the idle time without counting a delivery) before it is ``min_idle / 2`` idle
(worker.queue.consumer). An entry idle for longer than ``min_idle`` therefore belongs to a
consumer that stopped; XCLAIM (of those XPENDING lists as idle) moves it to us and counts one
more delivery, which the dead-letter rule reads. A job that crashed the engine when it ran
alone counts one more delivery the same way (``count_attempt``). Each call works on one
partition stream; ids here are that stream's own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import redis

from wire.keys import QueueKeys

CLAIM_CHOICES = 8  # idle entries listed per entry wanted, to pick from at random


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
        self._rng = random.Random(name)
        self._count_script: Any = None

    def count_attempt(self, client: redis.Redis, stream: str, entry_id: str) -> int | None:
        """One more delivery of ``entry_id`` (held by us); returns its count, None if not ours."""
        if self._count_script is None:
            self._count_script = client.register_script(_COUNT_ATTEMPT)
        count = int(self._count_script(keys=[stream], args=[self.keys.group, self.name, entry_id]))
        return count if count >= 0 else None

    def claim(self, client: redis.Redis, stream: str, count: int) -> list[Claimed]:
        """Take over up to ``count`` entries idle for at least min_idle.

        NOTE: XPENDING IDLE lists the idle ones wherever they are in the pending list (an
        XAUTOCLAIM of ``count`` scans only 10 x ``count`` entries from its cursor: a small
        window crawls through a long list), and XCLAIM with the same min-idle takes those still
        idle, so two consumers never both take one. Each picks at random among up to
        CLAIM_CHOICES x ``count`` listed, so consumers claiming at once mostly pick different
        entries. An entry deleted while pending comes back without fields: left out."""
        listed: Any = client.xpending_range(
            stream, self.keys.group, min="-", max="+", count=CLAIM_CHOICES * count, idle=self.min_idle_ms
        )
        if not listed:
            return []
        picked = self._rng.sample(listed, min(count, len(listed)))
        times = {info["message_id"]: int(info["times_delivered"]) for info in picked}
        taken: Any = client.xclaim(stream, self.keys.group, self.name, self.min_idle_ms, list(times))
        return [
            Claimed(entry_id.decode(), fields, times.get(entry_id, 0) + 1)
            for entry_id, fields in taken
            if fields
        ]

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
