"""What a resumed collect treats differently: rows superseded by ``dlq requeue`` or by a job
enqueued again with changed content, and results an earlier collect wrote elsewhere and
trimmed from Redis (never to be waited for)."""

from __future__ import annotations

from typing import Any

import redis

from producer.digest import stored_digests
from wire.keys import QueueKeys

_CHUNK = 10_000


def superseded_rows(
    client: redis.Redis, keys: QueueKeys, errors: dict[str, str], scope: set[str] | None
) -> set[str]:
    """Ids of error rows (``errors``: id -> the row's error code) whose job was requeued from
    the dead-letter stream since and whose outcome now differs: no result yet (it runs again)
    or a result other than the row's error. A job dead-lettered again keeps its row."""
    candidates = [i for i in errors if scope is None or i in scope]
    superseded: set[str] = set()
    for start in range(0, len(candidates), _CHUNK):
        chunk = candidates[start : start + _CHUNK]
        counts: list[Any] = client.hmget(keys.requeued, chunk)
        chunk = [i for i, count in zip(chunk, counts, strict=True) if count is not None]
        if not chunk:
            continue
        with client.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.done, chunk)
            pipe.hmget(keys.failed, chunk)
            marks, codes = pipe.execute()
        for job_id, mark, code in zip(chunk, marks, codes, strict=True):
            if mark is None or code is None or code.decode() != errors[job_id]:
                superseded.add(job_id)
    return superseded


def done_marks(client: redis.Redis, keys: QueueKeys, ids: list[str]) -> dict[str, bytes]:
    """The ``done`` marks of those ids that have one.

    Taken before reading the results stream to its end, they tell trimmed results apart: an
    id marked done before the read, still marked the same after it, whose result the read
    did not find, had its result trimmed."""
    marks: dict[str, bytes] = {}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        found: list[Any] = client.hmget(keys.done, chunk)
        marks.update((i, mark) for i, mark in zip(chunk, found, strict=True) if mark is not None)
    return marks


def changed_rows(
    client: redis.Redis, keys: QueueKeys, digests: dict[str, str], scope: set[str] | None
) -> set[str]:
    """Ids of rows (``digests``: id -> the digest the row carries) whose job the queue now holds
    with other content (``enqueue --rerun-changed``, or a run's new input): their new result
    replaces the row. Rows without a digest, and ids the queue has none for, are kept."""
    candidates = [i for i in digests if scope is None or i in scope]
    stored = stored_digests(client, keys, candidates)
    return {i for i in candidates if i in stored and stored[i] != digests[i]}
