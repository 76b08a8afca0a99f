"""An enqueue batch as the insert script (producer.insert) takes it: each row's digest, job
stream and encoded entry, computed once whatever the retries.

A batch carries at most MAX_BATCH_BYTES of entries (one script call is one Redis command,
held whole in the server's query buffer): a run of large jobs is cut into several batches; so
is a run that holds one id twice (the script takes distinct ids: the second one is checked
against what the first one wrote).

On a Redis Cluster one script holds keys of the queue's slot only. A job whose partition
stream has another slot is ``away``: before the script, the jobs of those not enqueued yet get
their entry (once per batch, whatever the retries: ``placed``) and their digest (HSETNX: a
digest another producer wrote first stays, and the script finds the row changed), and the
script records them without writing an entry; the others (a rerun, or an id enqueued
meanwhile) go to partition 0.

    NOTE: entry first, records after: a crash in between leaves an entry whose id is not
    enqueued yet (enqueued again by the retry: the job may run twice, collect writes it once),
    never an enqueued id without an entry.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import msgspec
import redis

from producer.digest import REJECTED, job_digest
from producer.insert import HEAD_KEYS, PLACED, REJECTED_ROW, Row
from wire.cluster import together
from wire.keys import FIELD_ID, FIELD_JOB, FIELD_KEY, QueueKeys
from wire.routing import partition_of, prefix_key
from wire.schema import Job, Result, encode, encode_job

MAX_BATCH_BYTES = 8 << 20
AWAY = -2  # ``where`` of a row whose job stream is outside the queue's slot, until it is placed


@dataclass
class Batch:
    rows: list[Row]
    streams: list[str]  # the job streams rows write to (a row's where: HEAD_KEYS + 1 + index)
    away: dict[int, str] = field(default_factory=dict)  # row index -> its stream, outside the slot
    placed: set[int] = field(default_factory=set)  # rows of ``away`` whose entry is written


def batches(
    client: redis.Redis,
    keys: QueueKeys,
    routing: tuple[int, int],
    jobs: list[Job | Result],
    enqueued_at_ms: int,
) -> list[Batch]:
    """``jobs`` (one enqueue batch, in order) as script batches: usually one."""
    partitions, chars = routing
    streams: list[str] = []
    where_of: dict[str, int] = {}
    out = [Batch([], streams)]
    size = 0
    ids: set[str] = set()
    for job in jobs:
        stream = ""
        if isinstance(job, Result):
            code = job.error.code if job.error is not None else ""
            row = Row(job.id, REJECTED, REJECTED_ROW, encode(job), code)
        else:
            key = prefix_key(job, chars)
            stream = keys.partition(partition_of(key, partitions))
            where = where_of.get(stream)
            if where is None:
                where = where_of[stream] = _where(client, keys, stream, streams)
            row = Row(job.id, job_digest(job), where, stamped(job, enqueued_at_ms), key)
        if (size + len(row.data) > MAX_BATCH_BYTES and out[-1].rows) or row.id in ids:
            out.append(Batch([], streams))
            size = 0
            ids.clear()
        size += len(row.data)
        ids.add(row.id)
        batch = out[-1]
        if row.where == AWAY:
            batch.away[len(batch.rows)] = stream
        batch.rows.append(row)
    return out


def stamped(job: Job, enqueued_at_ms: int) -> bytes:
    """The job as its entry carries it, with its enqueue time (set on a copy, without running
    the job's checks again as ``msgspec.structs.replace`` would: they passed when it was made)."""
    copied = copy.copy(job)
    msgspec.structs.force_setattr(copied, "enqueued_at_ms", enqueued_at_ms)
    return encode_job(copied)


def _where(client: redis.Redis, keys: QueueKeys, stream: str, streams: list[str]) -> int:
    if not together(client, [stream, keys.enqueued]):
        return AWAY
    streams.append(stream)
    return HEAD_KEYS + len(streams)


def place_away(client: redis.Redis, keys: QueueKeys, batch: Batch) -> list[Row]:
    """The rows to send to the script: those of ``away`` that are not enqueued yet get their
    entry now (if an earlier try did not) and are sent PLACED; the others go to partition 0."""
    if not batch.away:
        return batch.rows
    marks: Any = client.hmget(keys.enqueued, [batch.rows[i].id for i in batch.away])
    new = [i for i, mark in zip(batch.away, marks, strict=True) if mark is None and i not in batch.placed]
    if new:
        with client.pipeline(transaction=False) as pipe:
            for i in new:
                row = batch.rows[i]
                pipe.xadd(batch.away[i], {FIELD_ID: row.id, FIELD_JOB: row.data, FIELD_KEY: row.key})
                pipe.hsetnx(keys.digests, row.id, row.digest)  # NOTE: collect can name it at once
            pipe.execute()
        batch.placed.update(new)
    if keys.jobs not in batch.streams:
        batch.streams.append(keys.jobs)
    home = HEAD_KEYS + 1 + batch.streams.index(keys.jobs)
    return [
        row
        if i not in batch.away
        else row._replace(where=PLACED, data=b"")
        if i in batch.placed
        else row._replace(where=home)
        for i, row in enumerate(batch.rows)
    ]
