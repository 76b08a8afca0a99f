"""A worker's writes, each one MULTI/EXEC, made only into the queue its jobs came from.

    complete   XADD result (with its epoch), HSETNX done, HSET failed, XADD dead, XACK
    release    XADD the job again (same partition), XACK its entries

Every write carries the epoch its job was read under (worker.queue.jobqueue). The MULTI runs
under WATCH of the meta hash, after reading the epoch there: writes of another epoch are left
out (returned to the caller, who reports them), and a change of the meta hash in between (a
collect recording its trim, a lost queue enqueued again) aborts the EXEC, which is tried again.
So a result computed before Redis lost the queue never lands in the queue enqueued since.
"""

from __future__ import annotations

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

T = TypeVar("T", Write, Release)


def by_partition(entry_ids: Sequence[str]) -> dict[int, list[str]]:
    """Qualified entry ids grouped by partition, as that partition stream's own ids."""
    grouped: dict[int, list[str]] = {}
    for entry_id in entry_ids:
        partition, raw = split_id(entry_id)
        grouped.setdefault(partition, []).append(raw)
    return grouped


# One slot's writes that run after the MULTI on the queue's slot (a cluster only): the stream
# they go to, and the commands; ``atomic``: in a MULTI of their own.
Later = tuple[str, Callable[[Any], None], bool]


def complete(client: redis.Redis, keys: QueueKeys, writes: list[Write], acks: list[str]) -> list[Write]:
    """JobQueue.complete; returns the writes left out (another epoch).

    NOTE: on a cluster, acks of a partition outside the queue's slot follow the EXEC: a result
    always lands before its ack, and a crash in between leaves the entry pending, to run
    again and be written again (collect keeps the one ``done`` names)."""

    def queue_writes(pipe: Any, kept: list[Write]) -> list[Later]:
        to_ack = list(acks)
        for write in kept:
            completion, result = write.completion, write.completion.result
            fields: dict[Any, Any] = {FIELD_ID: result.id, FIELD_ENTRY: completion.entry_id}
            fields[FIELD_RESULT] = write.data
            if completion.epoch is not None:
                fields[FIELD_EPOCH] = completion.epoch
            pipe.xadd(keys.results, fields)
            pipe.hsetnx(keys.done, result.id, completion.entry_id)
            if result.error is not None:
                pipe.hset(keys.failed, result.id, result.error.code)
            if completion.dead is not None:
                dead = completion.dead
                letter: dict[Any, Any] = {FIELD_ID: result.id, FIELD_ENTRY: completion.entry_id}
                letter.update({FIELD_JOB: dead.job, FIELD_REASON: dead.reason, FIELD_ATTEMPTS: dead.attempts})
                pipe.xadd(keys.dead, letter)
            to_ack += [completion.entry_id, *completion.also_ack]
        return _acks(client, keys, pipe, by_partition(to_ack))

    return _under_epoch(client, keys, writes, lambda w: w.completion.epoch, queue_writes, bool(acks))


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

    return _under_epoch(client, keys, jobs, lambda j: j.epoch, queue_writes, False)


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
    always: bool,
) -> list[T]:
    """One MULTI of ``queue_writes(pipe, kept)`` for the items of the queue's epoch, under
    WATCH of the meta hash, then the writes it left for later; the others are returned.
    ``always``: run it with nothing kept."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.meta)
                raw: Any = pipe.hget(keys.meta, META_EPOCH)
                current = raw.decode() if raw is not None else None
                kept = [item for item in items if of_epoch(epoch_of(item), current)]
                if not kept and not always:
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
