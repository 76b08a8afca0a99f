"""Results written into Redis the way a worker's outbox does (result, done mark), by hand, and
what collect keeps of them in its spill."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import redis

from tests.jobs_stream import entry_fields, newest_entries, stream_of
from wire.keys import FIELD_ATTEMPTS, FIELD_ENTRY, FIELD_ID, FIELD_JOB, FIELD_REASON, FIELD_RESULT, QueueKeys
from wire.schema import Choice, Result, encode, error_result


def complete_all(client: redis.Redis, ids: list[str], keys: QueueKeys | None = None) -> None:
    """Write a counted result for each of ``ids`` (their newest jobs-stream entries)."""
    keys = keys or QueueKeys()
    entries = newest_entries(client, keys)
    for start in range(0, len(ids), 1000):
        with client.pipeline(transaction=True) as pipe:
            for job_id in ids[start : start + 1000]:
                choice = Choice(index=0, text=f"t {job_id}", token_ids=[], finish_reason="stop")
                result = encode(Result(id=job_id, choices=[choice]))
                fields = {FIELD_ID: job_id, FIELD_ENTRY: entries[job_id], FIELD_RESULT: result}
                pipe.xadd(keys.results, fields)  # type: ignore[arg-type]
                pipe.hsetnx(keys.done, job_id, entries[job_id])
                stream, raw = stream_of(entries[job_id], keys)
                pipe.xack(stream, keys.group, raw)
            pipe.execute()


def complete(
    client: redis.Redis,
    job_id: str,
    error: str | None = None,
    *,
    entry: str | None = None,
    keys: QueueKeys | None = None,
) -> None:
    """Write the counted result of one job (``entry``, default its newest jobs-stream entry),
    text ``t ID``; with ``error`` an error result (``dead_letter``: a dead letter too, which
    ``dlq requeue`` finds)."""
    keys = keys or QueueKeys()
    entry = entry or newest_entries(client, keys)[job_id]
    if error is None:
        result = Result(
            id=job_id, choices=[Choice(index=0, text=f"t {job_id}", token_ids=[], finish_reason="stop")]
        )
    else:
        result = error_result(job_id, error, f"{error} for {job_id}")
    with client.pipeline(transaction=True) as pipe:
        pipe.xadd(keys.results, {FIELD_ID: job_id, FIELD_ENTRY: entry, FIELD_RESULT: encode(result)})
        pipe.hsetnx(keys.done, job_id, entry)
        if error is not None:
            pipe.hset(keys.failed, job_id, error)
        if error == "dead_letter":
            job = entry_fields(client, entry, keys)[FIELD_JOB.encode()]
            letter = {
                FIELD_ID: job_id,
                FIELD_ENTRY: entry,
                FIELD_JOB: job,
                FIELD_REASON: "r",
                FIELD_ATTEMPTS: 4,
            }
            pipe.xadd(keys.dead, letter)  # type: ignore[arg-type]
        pipe.execute()


def spilled(out: Path) -> list[str]:
    """The ids collect's spill beside ``out`` holds, read with sqlite3 itself (none: no file)."""
    path = out.with_name(out.name + ".spill")
    if not path.exists():
        return []
    with sqlite3.connect(path) as db:
        return sorted(row[0] for row in db.execute("SELECT id FROM rows"))
