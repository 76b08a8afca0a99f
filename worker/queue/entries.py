"""Jobs-stream entries as Redis hands them over, made safe to handle.

An entry may have been written by anything with access to the stream, not only by
``enqueue``: its ``id`` field may be missing or not UTF-8, its payload anything. ``read_entry``
never fails (the job id it gives is always printable text, so the entry can be answered and
acknowledged); ``decode_entry`` raises only JobError, naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from producer.keys import FIELD_ID, FIELD_JOB
from producer.schema import Job, JobError, decode_job


@dataclass(frozen=True)
class Entry:
    entry_id: str
    job_id: str  # the id field as text; a stand-in (see ``problem``) when it is unusable
    data: bytes  # the encoded job, b"" when missing
    problem: str | None = None  # why the id field cannot be trusted


def read_entry(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Entry:
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    raw_id = fields.get(FIELD_ID.encode())
    data = fields.get(FIELD_JOB.encode(), b"")
    if raw_id is None:
        return Entry(entry_id, entry_id, data, f"entry {entry_id} has no {FIELD_ID!r} field")
    try:
        job_id = raw_id.decode()
    except UnicodeDecodeError:
        shown = raw_id.decode("utf-8", "backslashreplace")
        return Entry(
            entry_id, shown, data, f"the {FIELD_ID!r} field of entry {entry_id} is not UTF-8: {shown!r}"
        )
    if not job_id:
        return Entry(entry_id, entry_id, data, f"entry {entry_id} has an empty {FIELD_ID!r} field")
    return Entry(entry_id, job_id, data)


def decode_entry(entry: Entry) -> Job:
    """The entry's job; JobError when the entry, its payload or the job is not valid."""
    if entry.problem is not None:
        raise JobError("id", None, entry.problem)
    job = decode_job(entry.data)
    if job.id != entry.job_id:
        raise JobError(
            "id", job.id, f"differs from the stream entry's id field {entry.job_id!r}", entry.job_id
        )
    return job
