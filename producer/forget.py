"""What a trimming collect forgets: the per-job records of the jobs whose rows it has fsynced.

A queue keeps, per job id, its place in ``order``, its ``enqueued`` time (enqueue is idempotent
by it), its ``done`` mark, its ``failed`` code, its ``requeued`` count and its content
``digests`` entry, and its tag (producer.tags). Kept for ever they
grow without bound (18 MiB after 100k jobs). Once a trimming collect (``collect --trim``, the
queue's one collector) has a job's row fsynced in its output and the job is in the written
prefix of the order, Redis needs none of them: the row is the record. So it removes them, a
prefix of the order list at a time:

    MULTI   LTRIM order N -1; SREM tag:<T> and HDEL tags <the tagged ones>;
            HDEL enqueued/done/failed/requeued/digests <the N ids>;
            HINCRBY meta forgotten N, forgotten_failed <error rows among them>

under WATCH of the order list and the meta hash, after checking that the list's head is the
ids it wrote (anything else, and it forgets nothing). ``meta forgotten`` keeps the count:
positions in the order list are ``forgotten`` + index, the list's length seen by a loss check
is ``forgotten`` + LLEN, and ``status`` adds the counts to what it reads.

What forgetting costs: enqueueing a forgotten id again runs the job again (a collect into the
same output skips its row), and a collect into another output cannot name the forgotten ids
(it is told how many there were).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import redis

from producer.tags import tags_of, untag
from wire.keys import META_FORGOTTEN, META_FORGOTTEN_FAILED, QueueKeys

CHUNK = 10_000  # ids forgotten per transaction


def forgotten(client: redis.Redis, keys: QueueKeys) -> tuple[int, int]:
    """(ids forgotten from the head of the order list, how many of them had error rows)."""
    ids, failed = client.hmget(keys.meta, [META_FORGOTTEN, META_FORGOTTEN_FAILED])  # type: ignore[misc]
    return int(ids or 0), int(failed or 0)


def unrecorded(client: redis.Redis, keys: QueueKeys, ids: Sequence[str]) -> list[str]:
    """Of ``ids``, those the queue has no ``enqueued`` record of although it forgot some ids:
    forgotten, if they were ever enqueued (none, when the queue never forgot any)."""
    if not forgotten(client, keys)[0]:
        return []
    missing: list[str] = []
    for start in range(0, len(ids), CHUNK):
        chunk = list(ids[start : start + CHUNK])
        marks: Any = client.hmget(keys.enqueued, chunk)
        missing += [job_id for job_id, mark in zip(chunk, marks, strict=True) if mark is None]
    return missing


def forget_written(
    client: redis.Redis,
    keys: QueueKeys,
    expected: Sequence[str],
    written: int,
    base: int,
    errors: Container[str],
) -> int:
    """Forget the records of ``expected[:written]`` (ids in order, the first at order position
    ``base``, whose rows are fsynced) that are still at the head of the order list; ``errors``:
    the ids whose rows are error rows. Returns the order position forgotten up to."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.meta, keys.order)
                raw: Any = pipe.hget(keys.meta, META_FORGOTTEN)
                start = int(raw or 0) - base  # index in ``written`` of the order list's head
                end = min(written, start + CHUNK)
                if start < 0 or end <= start:
                    pipe.reset()
                    return base + max(start, 0)
                ids = list(expected[start:end])
                head: Any = pipe.lrange(keys.order, 0, len(ids) - 1)
                if [item.decode() for item in head] != ids:
                    pipe.reset()  # NOTE: not the order this collect wrote: leave it alone
                    return base + start
                tagged = tags_of(pipe, keys, ids)
                pipe.multi()
                pipe.ltrim(keys.order, len(ids), -1)
                untag(pipe, keys, tagged)
                for record in (keys.enqueued, keys.done, keys.failed, keys.requeued, keys.digests):
                    pipe.hdel(record, *ids)
                pipe.hincrby(keys.meta, META_FORGOTTEN, len(ids))
                pipe.hincrby(keys.meta, META_FORGOTTEN_FAILED, sum(i in errors for i in ids))
                pipe.execute()
            except redis.WatchError:
                continue  # NOTE: a new enqueue appended to the list: read it again
