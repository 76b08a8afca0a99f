"""A worker's writes, each atomic, made only into the queue its jobs came from.

    complete   one script: the epoch, the done marks of the batch (HMGET), then for each job
               not done yet: XADD result (with its epoch), XADD dead; one HSET done and one
               HSET failed for the batch; XACK of every entry it answers
    release    WATCH meta, then one MULTI: XADD the job again (same partition), XACK its entries

Every write carries the epoch its job was read under (worker.queue.jobqueue); writes of
another epoch than the queue's now are left out (returned to the caller, who reports them).
So a result computed before Redis lost the queue never lands in the queue enqueued since.
``complete`` reads the epoch inside its script, so nothing can come between the check and the
writes; ``release`` (rare: a draining worker) reads it under WATCH of the meta hash, and a
change of the meta hash in between aborts the EXEC, which is tried again.

A job whose ``done`` mark is already set (another delivery of it was written first) gets no
second result: its entries are only acknowledged. So the first result written counts, and
the results stream holds one result per job but where a cluster's late acks (below) let a job
run twice.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from wire.cluster import together
from wire.keys import (
    FIELD_ATTEMPTS,
    FIELD_ENTRY,
    FIELD_EPOCH,
    FIELD_ID,
    FIELD_JOB,
    FIELD_KEY,
    FIELD_REASON,
    FIELD_RESULT,
    META_EPOCH,
    QueueKeys,
)
from wire.routing import split_id
from worker.queue.jobqueue import Release, Write, of_epoch

T = TypeVar("T")


def by_partition(entry_ids: Sequence[str]) -> dict[int, list[str]]:
    """Qualified entry ids grouped by partition, as that partition stream's own ids."""
    grouped: dict[int, list[str]] = {}
    for entry_id in entry_ids:
        partition, raw = split_id(entry_id)
        grouped.setdefault(partition, []).append(raw)
    return grouped


# One slot's writes that run after release's MULTI on the queue's slot (a cluster only): the stream
# they go to, and the commands; ``atomic``: in a MULTI of their own.
Later = tuple[str, Callable[[Any], None], bool]


# KEYS: meta, results, done, failed, dead, then the partition streams acknowledged here.
# ARGV: group, the number of writes, WRITE_FIELDS for each write (id, entry, encoded result,
# epoch or "", error code or "", "1" for a dead letter, its job, reason and attempts, and the
# entries it answers as "K:id K:id", K the index in KEYS), then the other entries to ack.
# Returns the queue's epoch ("": none; not read when there are no writes).
_COMPLETE = string.Template("""
local unpack = unpack or table.unpack
local group, count = ARGV[1], tonumber(ARGV[2])
local CHUNK = 1000
-- NOTE: a denied command says which (Redis 7.0 says only that the script's user may not run
-- "this command"); the first write is the first XADD, so a denial writes nothing
local function call(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, "can't run this command", 1, true) then
      return error({err = "NOPERM this user has no permissions to run the '" .. string.lower(...) .. "' command"})
    end
    return error(reply)
  end
  return reply
end
local function each_chunk(list, step, fn)
  for i = 1, #list, step do
    fn({unpack(list, i, math.min(i + step - 1, #list))})
  end
end
local current = ''
if count > 0 then current = call('HGET', KEYS[1], '$META_EPOCH') or '' end
local kept, ids = {}, {}
for i = 0, count - 1 do
  local base = 3 + i * $WRITE_FIELDS
  if ARGV[base + 3] == '' or ARGV[base + 3] == current then
    kept[#kept + 1] = base
    ids[#ids + 1] = ARGV[base]
  end
end
local marks = {}
each_chunk(ids, CHUNK, function(part)
  for _, mark in ipairs(call('HMGET', KEYS[3], unpack(part))) do marks[#marks + 1] = mark end
end)
local to_ack, done, failed, seen = {}, {}, {}, {}
local function ack(list)
  for k, raw in string.gmatch(list, '(%d+):(%S+)') do
    k = tonumber(k)
    to_ack[k] = to_ack[k] or {}
    to_ack[k][#to_ack[k] + 1] = raw
  end
end
for j, base in ipairs(kept) do
  local id, entry = ARGV[base], ARGV[base + 1]
  if not marks[j] and not seen[id] then
    seen[id] = true
    if ARGV[base + 3] == '' then
      call('XADD', KEYS[2], '*', '$FIELD_ID', id, '$FIELD_ENTRY', entry, '$FIELD_RESULT', ARGV[base + 2])
    else
      call('XADD', KEYS[2], '*', '$FIELD_ID', id, '$FIELD_ENTRY', entry, '$FIELD_RESULT', ARGV[base + 2],
        '$FIELD_EPOCH', ARGV[base + 3])
    end
    done[#done + 1] = id
    done[#done + 1] = entry
    if ARGV[base + 4] ~= '' then
      failed[#failed + 1] = id
      failed[#failed + 1] = ARGV[base + 4]
    end
    if ARGV[base + 5] == '1' then
      call('XADD', KEYS[5], '*', '$FIELD_ID', id, '$FIELD_ENTRY', entry, '$FIELD_JOB', ARGV[base + 6],
        '$FIELD_REASON', ARGV[base + 7], '$FIELD_ATTEMPTS', ARGV[base + 8])
    end
  end
  ack(ARGV[base + 9])
end
ack(ARGV[3 + count * $WRITE_FIELDS])
each_chunk(done, CHUNK, function(part) call('HSET', KEYS[3], unpack(part)) end)
each_chunk(failed, CHUNK, function(part) call('HSET', KEYS[4], unpack(part)) end)
for k, raws in pairs(to_ack) do
  each_chunk(raws, CHUNK, function(part) call('XACK', KEYS[k], group, unpack(part)) end)
end
return current
""").substitute(
    WRITE_FIELDS=10,
    META_EPOCH=META_EPOCH,
    FIELD_ID=FIELD_ID,
    FIELD_ENTRY=FIELD_ENTRY,
    FIELD_RESULT=FIELD_RESULT,
    FIELD_EPOCH=FIELD_EPOCH,
    FIELD_JOB=FIELD_JOB,
    FIELD_REASON=FIELD_REASON,
    FIELD_ATTEMPTS=FIELD_ATTEMPTS,
)


def complete_script(client: redis.Redis) -> Any:
    """The script ``complete`` runs, registered with ``client`` (no Redis call yet)."""
    return client.register_script(_COMPLETE)


def complete(
    client: redis.Redis, keys: QueueKeys, writes: list[Write], acks: list[str], script: Any
) -> list[Write]:
    """JobQueue.complete, in one ``script`` (complete_script); returns the writes left out
    (another epoch).

    NOTE: on a cluster, acks of a partition outside the queue's slot follow the script: a
    result always lands before its ack, and a crash in between leaves the entry pending, to be
    reclaimed and only acknowledged (its job is done)."""
    script_keys = [keys.meta, keys.results, keys.done, keys.failed, keys.dead]
    index: dict[str, int] = {}  # partition stream -> its index in KEYS (Lua's, from 1)

    def split(entry_ids: Sequence[str]) -> tuple[str, dict[str, list[str]]]:
        """The entries acked by the script (as its "K:id" list), and those acked after it."""
        inside: list[str] = []
        outside: dict[str, list[str]] = {}
        for partition, raw_ids in by_partition(entry_ids).items():
            stream = keys.partition(partition)
            if not together(client, [keys.meta, stream]):
                outside.setdefault(stream, []).extend(raw_ids)
                continue
            if stream not in index:
                script_keys.append(stream)
                index[stream] = len(script_keys)
            inside += [f"{index[stream]}:{raw}" for raw in raw_ids]
        return " ".join(inside), outside

    args: list[Any] = [keys.group, len(writes)]
    outside_of: list[dict[str, list[str]]] = []
    for write in writes:
        completion, result = write.completion, write.completion.result
        dead = completion.dead
        inside, outside = split([completion.entry_id, *completion.also_ack])
        outside_of.append(outside)
        args += [
            result.id,
            completion.entry_id,
            write.data,
            completion.epoch or "",
            result.error.code if result.error is not None else "",
            "1" if dead is not None else "",
            dead.job if dead is not None else b"",
            dead.reason if dead is not None else "",
            dead.attempts if dead is not None else 0,
            inside,
        ]
    # the acks outside the slot: those of ``acks``, then those of the writes kept
    acks_inside, later = split(acks)
    args.append(acks_inside)
    raw: Any = script(keys=script_keys, args=args, client=client)
    current = (raw.decode() if isinstance(raw, bytes) else raw) or None
    dropped: list[Write] = []
    for write, outside in zip(writes, outside_of, strict=True):
        if not of_epoch(write.completion.epoch, current):
            dropped.append(write)
            continue
        for stream, raw_ids in outside.items():
            later.setdefault(stream, []).extend(raw_ids)
    if later:
        with client.pipeline(transaction=False) as batch:
            for stream, raw_ids in later.items():
                batch.xack(stream, keys.group, *raw_ids)
            batch.execute()
    return dropped


def release(client: redis.Redis, keys: QueueKeys, jobs: list[Release]) -> list[Release]:
    """JobQueue.release; returns the jobs left out (another epoch).

    NOTE: on a cluster, a job of a partition outside the queue's slot is given back in a MULTI
    of its partition's slot (new entry and ack together), after the EXEC that checked the epoch."""

    def queue_writes(pipe: Any, kept: list[Release]) -> list[Later]:
        # NOTE: given back as new entries of the same partition (the old ones acknowledged in
        # the same transaction), so other workers get them now instead of after min_idle.
        later: list[Later] = []
        for job in kept:
            partition = split_id(job.entry_ids[0])[0]
            stream = keys.partition(partition)
            grouped = by_partition(job.entry_ids)
            fields = {FIELD_ID: job.job_id, FIELD_JOB: job.data, FIELD_KEY: job.key}
            if together(client, [keys.meta, stream]):
                pipe.xadd(stream, fields)
                later += _acks(client, keys, pipe, grouped)
                continue
            own = grouped.pop(partition)

            def give_back(p: Any, stream: str = stream, fields: Any = fields, own: list[str] = own) -> None:
                p.xadd(stream, fields)
                p.xack(stream, keys.group, *own)

            later.append((stream, give_back, True))
            later += _acks(client, keys, None, grouped)
        return later

    return _under_epoch(client, keys, jobs, lambda j: j.epoch, queue_writes)


def _acks(client: redis.Redis, keys: QueueKeys, pipe: Any, grouped: dict[int, list[str]]) -> list[Later]:
    """XACK the entries: into ``pipe`` where they share its slot, else as writes for later."""
    later: list[Later] = []
    for partition, raw_ids in grouped.items():
        stream = keys.partition(partition)
        if pipe is not None and together(client, [keys.meta, stream]):
            pipe.xack(stream, keys.group, *raw_ids)
        else:

            def ack(p: Any, stream: str = stream, raw_ids: list[str] = raw_ids) -> None:
                p.xack(stream, keys.group, *raw_ids)

            later.append((stream, ack, False))
    return later


def _under_epoch(
    client: redis.Redis,
    keys: QueueKeys,
    items: list[T],
    epoch_of: Callable[[T], str | None],
    queue_writes: Callable[[Any, list[T]], list[Later]],
) -> list[T]:
    """One MULTI of ``queue_writes(pipe, kept)`` for the items of the queue's epoch, under
    WATCH of the meta hash, then the writes it left for later; the others are returned."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.meta)
                raw: Any = pipe.hget(keys.meta, META_EPOCH)
                current = raw.decode() if raw is not None else None
                kept = [item for item in items if of_epoch(epoch_of(item), current)]
                if not kept:
                    pipe.reset()
                    return items
                pipe.multi()
                later = queue_writes(pipe, kept)
                pipe.execute()
                break
            except redis.WatchError:
                continue  # NOTE: the meta hash changed between the WATCH and the EXEC: read it again
    plain = [(stream, write) for stream, write, atomic in later if not atomic]
    if plain:
        with client.pipeline(transaction=False) as batch:
            for _, write in plain:
                write(batch)
            batch.execute()
    for _, write, atomic in later:
        if atomic:
            with client.pipeline(transaction=True) as one:
                write(one)
                one.execute()
    return [item for item in items if not of_epoch(epoch_of(item), current)]
