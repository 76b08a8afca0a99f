"""The scan of cancel (producer.cancel): the entries of a queue's partition streams whose jobs
a cancel is to end, read on the server.

A partition stream holds the entries not delivered yet, those held by workers, and acknowledged
ones the workers have not trimmed yet: every job without a result has its entry there. ``chunk``
reads SCAN_COUNT of them past ``start`` in one script call (_SCAN) and sends back only those of
the filter's jobs (all, or the members of a set: a tag's, or the ids of a ``cancel --ids``)
that are enqueued and have no result, with their payload. On a Redis Cluster a partition in a
slot of its own cannot share a script with the queue's hashes: ``apart`` reads it with XRANGE
and asks the queue's slot about the ids (the same rule, two round trips).
"""

from __future__ import annotations

import string
from typing import Any

import redis

from wire.cluster import together
from wire.keys import FIELD_ID, FIELD_JOB, QueueKeys

SCAN_COUNT = 250  # stream entries one scan call reads (a few ms of Redis: benchmarks/cancel_cost.py)
SCAN_BYTES = 16 << 20  # payload one scan call returns, at most (past one entry)
Found = list[tuple[bytes, bytes, bytes]]  # (entry id, job id, payload)

# KEYS: the partition stream, done, enqueued, the filter set (ARGV[3] "set"; else not read).
# ARGV: start (exclusive "(id", or "-"), count, "all" | "set", byte budget.
# Returns {last entry read ("" for none), {entry, id, payload, ...}}.
_SCAN = string.Template("""
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
local found, last, size = {}, '', 0
for _, entry in ipairs(entries) do
  local fields, id, job = entry[2], nil, ''
  for i = 1, #fields, 2 do
    if fields[i] == '$FIELD_ID' then id = fields[i + 1] elseif fields[i] == '$FIELD_JOB' then job = fields[i + 1] end
  end
  if id and (ARGV[3] == 'all' or redis.call('SISMEMBER', KEYS[4], id) == 1)
      and redis.call('HEXISTS', KEYS[2], id) == 0 and redis.call('HEXISTS', KEYS[3], id) == 1 then
    found[#found + 1] = entry[1]
    found[#found + 1] = id
    found[#found + 1] = job
    size = size + #job
  end
  last = entry[1]
  if size > tonumber(ARGV[4]) then break end
end
return {last, found}
""").substitute(FIELD_ID=FIELD_ID, FIELD_JOB=FIELD_JOB)


class StreamScan:
    """Reads the partition streams of ``keys``' queue for a cancel."""

    def __init__(self, client: redis.Redis, keys: QueueKeys) -> None:
        self.redis = client
        self.keys = keys
        self.script = client.register_script(_SCAN)

    def chunk(
        self, stream: str, start: str, filter_key: str | None
    ) -> tuple[str, Found]:
        """(the last entry read, "" at the end; the (entry, id, payload) of the filter's jobs)."""
        keys = self.keys
        if together(self.redis, [stream, keys.done]):
            raw: Any = self.script(
                keys=[stream, keys.done, keys.enqueued, filter_key or keys.done],
                args=[start, SCAN_COUNT, "all" if filter_key is None else "set", SCAN_BYTES],
                client=self.redis,
            )
            last, flat = raw
            found = [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]
            return (last.decode() if isinstance(last, bytes) else last), found
        return self.apart(stream, start, filter_key)

    def apart(
        self, stream: str, start: str, filter_key: str | None
    ) -> tuple[str, Found]:
        """``chunk`` for a partition in a slot of its own (a cluster): XRANGE there, the
        checks on the queue's slot."""
        keys = self.keys
        entries: Any = self.redis.xrange(stream, start, "+", count=SCAN_COUNT)
        if not entries:
            return "", []
        rows = [
            (entry_id, fields.get(FIELD_ID.encode()), fields.get(FIELD_JOB.encode(), b""))
            for entry_id, fields in entries
        ]
        rows = [row for row in rows if row[1] is not None]
        ids = [row[1] for row in rows]
        if not ids:
            return entries[-1][0].decode(), []
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.done, ids)
            pipe.hmget(keys.enqueued, ids)
            if filter_key is not None:
                pipe.smismember(filter_key, ids)
            replies = pipe.execute()
        member = replies[2] if filter_key is not None else [1] * len(ids)
        found = [
            row
            for row, mark, record, is_member in zip(rows, replies[0], replies[1], member, strict=True)
            if mark is None and record is not None and is_member
        ]
        return entries[-1][0].decode(), found
