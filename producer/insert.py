"""One enqueue batch, written by one script: the check of each id and the writes it decides.

The script reads the queue's epoch and the ``enqueued``, ``digests`` and ``done`` records of
the batch's ids, gives each row its fate and writes what the fates say, with nothing of
another client between the reads and the writes (a script runs alone). So producers that
enqueue at once never retry each other's batches (a WATCH of the whole ``enqueued`` hash made
every batch another producer committed abort this one), and two producers racing on one id
add it once.

    fate  e  enqueued: a new id: its entry (or, for a rejected row, its result), digest,
             enqueue time and place in ``order``
          s  skipped: there with the same content (or from before digests were kept)
          c  changed: there with other content: kept as it was
          r  rerun: changed and done, and the caller asked for it: its ``done``/``failed``
             marks go, its new entry and digest come in

A batch is all or nothing: the script checks the epoch and decides every fate before its
first write; Redis refuses a script at ``maxmemory`` only at its first write (never half-way);
and on Redis 7 it checks every write against the user's ACL (``redis.acl_check_cmd``) before
the first one (an older Redis stops a script at a denied command, keeping what it wrote). It writes nothing when the queue's epoch is not the producer's (Redis lost the
queue since the enqueue began: QueueLost), nor, with ``stop_on_changed``, when a row is changed.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from wire.keys import (
    ENTRY_REJECTED,
    FIELD_ENTRY,
    FIELD_ID,
    FIELD_JOB,
    FIELD_KEY,
    FIELD_RESULT,
    META_EPOCH,
    QueueKeys,
)

HEAD_KEYS = 8  # KEYS before the job streams: a row's ``where`` counts on from HEAD_KEYS + 1
PLACED = 0  # ``where`` of a job whose entry was written ahead of the script (a cluster)
REJECTED_ROW = -1  # ``where`` of a rejected row: its result goes to the results stream
_WHERE_BIAS = 2  # ``where`` travels as two bytes, big-endian, biased to be >= 0

# KEYS: meta, enqueued, digests, done, failed, order, results, the batch's key (its fates, kept
# ``keep_ms`` for a retry), then the job streams written.
# ARGV: epoch, rerun ("1" or ""), stop ("1" or ""), enqueued_at_ms, keep_ms, each row's where
# (the KEYS index of its job stream, PLACED or REJECTED_ROW; two bytes a row), then per row:
# id, digest, data (the encoded job or result; "" when PLACED), key (a job's prefix key, a
# rejected row's error code). The ids of one call are distinct (the caller cuts batches so).
# Returns {"lost", the epoch now or ""}, {"changed", fates} (stop: nothing written) or
# {"ok", fates}: one letter per row (the module docstring); a batch whose key is there already
# (its reply was lost) returns the fates kept, writing nothing.
# NOTE: Lua time is Redis time: per row, one XADD and plain loops; lists go whole to commands.
_INSERT = string.Template("""
local unpack = unpack or table.unpack
local CHUNK = 1000
local epoch, rerun, stop, at, keep_ms, wheres = ARGV[1], ARGV[2] == '1', ARGV[3] == '1', ARGV[4], ARGV[5], ARGV[6]
local FIRST, FIELDS = 7, 4
local count = #wheres / 2
local function allowed(command, key, ...)
  if redis.acl_check_cmd and not redis.acl_check_cmd(command, key, ...) then
    error({err = "NOPERM this user has no permissions to run the '" .. string.lower(command)
      .. "' command on key '" .. key .. "'"})
  end
end
local function each_chunk(command, key, list)
  for i = 1, #list, CHUNK do redis.call(command, key, unpack(list, i, math.min(i + CHUNK - 1, #list))) end
end
allowed('HGET', KEYS[1], 'f')
allowed('GET', KEYS[8])
local current = redis.call('HGET', KEYS[1], '$META_EPOCH')
if current ~= epoch then return {'lost', current or ''} end
local earlier = redis.call('GET', KEYS[8])
if earlier then return {'ok', earlier} end
local ids = {}
for j = 1, count do ids[j] = ARGV[FIRST + (j - 1) * FIELDS] end
local function marks(key)
  allowed('HMGET', key, 'f')
  if count <= CHUNK then return redis.call('HMGET', key, unpack(ids)) end
  local found = {}
  for i = 1, count, CHUNK do
    local part = redis.call('HMGET', key, unpack(ids, i, math.min(i + CHUNK - 1, count)))
    for k = 1, #part do found[i + k - 1] = part[k] end
  end
  return found
end
local seen, stored, done = marks(KEYS[2]), marks(KEYS[3]), marks(KEYS[4])
local fates, changed = {}, false
for j = 1, count do
  local fate = 'e'
  if seen[j] then
    local old = stored[j]
    if not old or old == ARGV[FIRST + (j - 1) * FIELDS + 1] then fate = 's'
    elseif rerun and done[j] then fate = 'r'
    else fate = 'c'; changed = true end
  end
  fates[j] = fate
end
local letters = table.concat(fates)
if stop and changed then return {'changed', letters} end
local undone, digests, enqueued, order, done_marks, failed_marks = {}, {}, {}, {}, {}, {}
local streams = {}  -- KEYS index -> true: the streams this batch writes to
for j = 1, count do
  local fate = fates[j]
  if fate == 'e' or fate == 'r' then
    local base = FIRST + (j - 1) * FIELDS
    local id = ARGV[base]
    local high, low = string.byte(wheres, 2 * j - 1, 2 * j)
    local where = high * 256 + low - $WHERE_BIAS
    if fate == 'r' then undone[#undone + 1] = id end
    if where > $PLACED then streams[where] = true end
    if where == $REJECTED_ROW then
      streams[7] = true
      done_marks[#done_marks + 1] = id
      done_marks[#done_marks + 1] = '$ENTRY_REJECTED'
      if ARGV[base + 3] ~= '' then
        failed_marks[#failed_marks + 1] = id
        failed_marks[#failed_marks + 1] = ARGV[base + 3]
      end
    end
    digests[#digests + 1] = id
    digests[#digests + 1] = ARGV[base + 1]
    if fate == 'e' then
      enqueued[#enqueued + 1] = id
      enqueued[#enqueued + 1] = at
      order[#order + 1] = id
    end
  end
end
-- every write is allowed before the first one: a denial writes nothing (Redis 7)
for k in pairs(streams) do allowed('XADD', KEYS[k], '*', 'f', 'v') end
if #undone > 0 then allowed('HDEL', KEYS[4], 'f'); allowed('HDEL', KEYS[5], 'f') end
if #digests > 0 then allowed('HSET', KEYS[3], 'f', 'v') end
if #enqueued > 0 then allowed('HSET', KEYS[2], 'f', 'v'); allowed('RPUSH', KEYS[6], 'v') end
if #done_marks > 0 then allowed('HSET', KEYS[4], 'f', 'v') end
if #failed_marks > 0 then allowed('HSET', KEYS[5], 'f', 'v') end
allowed('SET', KEYS[8], 'v', 'PX', '1')
each_chunk('HDEL', KEYS[4], undone)
each_chunk('HDEL', KEYS[5], undone)
for j = 1, count do
  local fate = fates[j]
  if fate == 'e' or fate == 'r' then
    local base = FIRST + (j - 1) * FIELDS
    local high, low = string.byte(wheres, 2 * j - 1, 2 * j)
    local where = high * 256 + low - $WHERE_BIAS
    if where > $PLACED then
      redis.call('XADD', KEYS[where], '*', '$FIELD_ID', ARGV[base], '$FIELD_JOB', ARGV[base + 2],
        '$FIELD_KEY', ARGV[base + 3])
    elseif where == $REJECTED_ROW then
      redis.call('XADD', KEYS[7], '*', '$FIELD_ID', ARGV[base], '$FIELD_ENTRY', '$ENTRY_REJECTED',
        '$FIELD_RESULT', ARGV[base + 2])
    end
  end
end
each_chunk('HSET', KEYS[3], digests)
each_chunk('HSET', KEYS[2], enqueued)
each_chunk('RPUSH', KEYS[6], order)
each_chunk('HSET', KEYS[4], done_marks)
each_chunk('HSET', KEYS[5], failed_marks)
redis.call('SET', KEYS[8], letters, 'PX', keep_ms)
return {'ok', letters}
""").substitute(
    PLACED=PLACED,
    REJECTED_ROW=REJECTED_ROW,
    WHERE_BIAS=_WHERE_BIAS,
    META_EPOCH=META_EPOCH,
    ENTRY_REJECTED=ENTRY_REJECTED,
    FIELD_ID=FIELD_ID,
    FIELD_ENTRY=FIELD_ENTRY,
    FIELD_RESULT=FIELD_RESULT,
    FIELD_JOB=FIELD_JOB,
    FIELD_KEY=FIELD_KEY,
)

FATES = {"e": "enqueued", "s": "skipped", "c": "changed", "r": "rerun"}


class QueueLost(redis.RedisError):
    """The queue's epoch is not the one this enqueue began with: Redis lost the queue (restarted
    without its data, or its keys were deleted) while it enqueued; ``str()`` says so in one line."""

    def __init__(self, queue: str, epoch: str, current: str | None) -> None:
        now = f"replaced by {current}" if current else "gone"
        super().__init__(
            f"queue {queue!r}: Redis lost this queue's data while it was being enqueued (epoch {epoch} "
            f"is {now}): the jobs enqueued before are lost with it"
        )


class Row(NamedTuple):
    """One row of a batch as the script takes it: ``where`` in the batch's packed argument, the
    other fields as the row's own arguments, in this order."""

    id: str
    digest: str
    where: int
    data: bytes
    key: str


@dataclass(frozen=True)
class Outcome:
    """The fate of each row (FATES' values), and whether the script wrote them (False: it
    stopped at a changed row, writing nothing)."""

    fates: list[str]
    written: bool


class Insert:
    """The enqueue script of one queue, registered with ``client`` (loaded at its first call)."""

    def __init__(self, client: redis.Redis, keys: QueueKeys) -> None:
        self.client = client
        self.keys = keys
        self.script = client.register_script(_INSERT)

    def __call__(
        self,
        epoch: str,
        token: str,
        rows: Sequence[Row],
        streams: Sequence[str],
        enqueued_at_ms: int,
        *,
        keep_ms: int,
        rerun_changed: bool,
        stop_on_changed: bool,
    ) -> Outcome:
        """Run the script over ``rows`` (a row's ``where``: HEAD_KEYS + 1 + its stream's index
        in ``streams``), as batch ``token`` (drawn once per batch: a retry with the same token
        after a lost reply gets the first try's fates back, kept for ``keep_ms``)."""
        keys = self.keys
        head = [keys.meta, keys.enqueued, keys.digests, keys.done, keys.failed, keys.order, keys.results]
        flags = ["1" if rerun_changed else "", "1" if stop_on_changed else ""]
        wheres = b"".join((row.where + _WHERE_BIAS).to_bytes(2, "big") for row in rows)
        args: list[Any] = [epoch, *flags, enqueued_at_ms, keep_ms, wheres]
        for row in rows:
            args += (row.id, row.digest, row.data, row.key)
        reply: Any = self.script(keys=[*head, keys.batch(token), *streams], args=args, client=self.client)
        status, value = (_text(part) for part in reply)
        if status == "lost":
            raise QueueLost(keys.queue, epoch, value or None)
        return Outcome([FATES[letter] for letter in value], written=status == "ok")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
