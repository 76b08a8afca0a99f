"""A job's content digest: what tells a changed row under a known id from the same row again.

Enqueue keeps each job's digest in the queue (the ``digests`` hash) and collect writes it into
every output row (``job_digest``), so both a second enqueue of an id and a resumed run can tell
a row whose prompt, sampling, model or metadata changed since from one that is the same, and
say so instead of keeping the old answer.

The digest covers what the job asks for, with fields at their defaults left out (so a later
radixq that adds a field with a default gives the same digests) and the enqueue time, schema
version and prefix key (routing only) never in it. A row rejected before it could run has the
digest ``rejected``: running it again only matters once it is a valid job.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import msgspec

from wire.keys import QueueKeys
from wire.schema import Job, Result

REJECTED = "rejected"
_NOT_CONTENT = frozenset({"enqueued_at_ms", "v", "prefix_key"})
_NO_DEFAULT = object()  # a field without a default: always in the content


def job_digest(row: Job | Result) -> str:
    """16 hex digits of SHA-256 over the job's content (sorted JSON), or ``rejected``."""
    if isinstance(row, Result):
        return REJECTED
    content = msgspec.json.encode(_content(row), order="sorted")
    return hashlib.sha256(content).hexdigest()[:16]


def _content(value: msgspec.Struct) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for name, default in _content_fields(type(value)):
        item = getattr(value, name)
        if default is not _NO_DEFAULT and item == default:
            continue
        record[name] = _nested(item) if isinstance(item, msgspec.Struct) else msgspec.to_builtins(item)
    return record


# Nested structs seen lately (their id -> the struct, its content as sorted JSON): the jobs of
# a file mostly share one SamplingParams object (producer.jsonl validates each one once).
_NESTED_MAX = 256
_nested_seen: dict[int, tuple[msgspec.Struct, msgspec.Raw]] = {}


def _nested(value: msgspec.Struct) -> msgspec.Raw:
    seen = _nested_seen.get(id(value))
    if seen is not None and seen[0] is value:  # NOTE: the struct is held, so its id is not reused
        return seen[1]
    raw = msgspec.Raw(msgspec.json.encode(_content(value), order="sorted"))
    if len(_nested_seen) >= _NESTED_MAX:
        _nested_seen.clear()
    _nested_seen[id(value)] = (value, raw)
    return raw


@functools.cache
def _content_fields(kind: type[msgspec.Struct]) -> tuple[tuple[str, Any], ...]:
    """(name, default value) of each content field of a Struct type, read once per type
    (``msgspec.structs.fields`` evaluates the type annotations on every call); a default
    factory is called here once: its value is only compared with, never handed out."""
    fields: list[tuple[str, Any]] = []
    for field in msgspec.structs.fields(kind):
        if field.name in _NOT_CONTENT:
            continue
        if field.default is not msgspec.NODEFAULT:
            default = field.default
        elif field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        else:
            default = _NO_DEFAULT
        fields.append((field.name, default))
    return tuple(fields)


def changed_ids(rows: list[Job | Result], known: dict[str, str]) -> list[str]:
    """Ids of ``rows`` whose digest differs from the one ``known`` holds for them (ids it does
    not hold, or holds no digest for, are not changed: nothing to compare with)."""
    return [row.id for row in rows if row.id in known and known[row.id] != job_digest(row)]


def stored_digests(client: Any, keys: QueueKeys, ids: list[str]) -> dict[str, str]:
    """The digests the queue holds for those ids that have one (job_digest)."""
    found: dict[str, str] = {}
    for start in range(0, len(ids), 10_000):
        chunk = ids[start : start + 10_000]
        values: list[Any] = client.hmget(keys.digests, chunk)
        found.update((i, v.decode()) for i, v in zip(chunk, values, strict=True) if v is not None)
    return found


def changed_line(ids: list[str], since: str) -> str:
    """One line naming the ids whose content changed ``since`` (e.g. "they were enqueued")."""
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    noun = "id changed" if len(ids) == 1 else "ids changed"
    return f"{len(ids)} {noun} (prompt, sampling, model or metadata) since {since}: {shown}"
