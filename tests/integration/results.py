"""Results written into Redis the way a worker's outbox does (result, done mark), by hand."""

from __future__ import annotations

import redis

from tests.jobs_stream import newest_entries, stream_of
from wire.keys import FIELD_ENTRY, FIELD_ID, FIELD_RESULT, QueueKeys
from wire.schema import Choice, Result, encode


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
