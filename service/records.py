"""File and batch records, in Redis (wire.keys: ``files``, ``batches`` and their order sets).

A record is a msgspec Struct stored as JSON in its hash; what the API returns is built from it
(``to_openai``). A batch's status changes only through ``Records.move``: a WATCHed read, a check
that the status is one the move starts from, then the write, so a cancel and the service that
collects the batch never overwrite each other. Live request counts are a field of their own
(``batch_counts``), written by the collecting service without a transaction.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec
import redis

from wire.keys import QueueKeys

FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def now_s() -> int:
    return int(time.time())


class FileRecord(msgspec.Struct, kw_only=True):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    lines: int = 0  # request lines (input files) or rows (output files)
    models: list[str] = []  # distinct body.model values of an input file (at most MAX_MODELS)
    urls: list[str] = []  # distinct request urls of an input file

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


class BatchError(msgspec.Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchRecord(msgspec.Struct, kw_only=True):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    total: int = 0
    metadata: dict[str, str] | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[BatchError] = []
    completed: int = 0  # final counts (a final batch); live ones are in batch_counts
    failed: int = 0

    def to_openai(self, counts: tuple[int, int] | None = None) -> dict[str, Any]:
        completed, failed = (
            counts if counts is not None and self.status not in FINAL else (self.completed, self.failed)
        )
        errors = None
        if self.errors:
            errors = {"object": "list", "data": [msgspec.to_builtins(error) for error in self.errors]}
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": completed, "failed": failed},
            "metadata": self.metadata,
        }


_file_decoder = msgspec.json.Decoder(FileRecord)
_batch_decoder = msgspec.json.Decoder(BatchRecord)


class Records:
    """The service's records of one queue."""

    def __init__(self, client: redis.Redis, keys: QueueKeys) -> None:
        self.redis = client
        self.keys = keys

    # ---- files ------------------------------------------------------------------------------

    def put_file(self, record: FileRecord) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.files, record.id, msgspec.json.encode(record))
            pipe.zadd(self.keys.file_order, {record.id: record.created_at * 1000 + _tiebreak()})
            pipe.execute()

    def file(self, file_id: str) -> FileRecord | None:
        raw: Any = self.redis.hget(self.keys.files, file_id)
        return _file_decoder.decode(raw) if raw is not None else None

    def delete_file(self, file_id: str) -> bool:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.files, file_id)
            pipe.zrem(self.keys.file_order, file_id)
            removed, _ = pipe.execute()
        return bool(removed)

    def files(self, after: str | None, limit: int, newest_first: bool) -> tuple[list[FileRecord], bool]:
        ids, more = self._page(self.keys.file_order, after, limit, newest_first)
        raws: list[Any] = self.redis.hmget(self.keys.files, ids) if ids else []
        return [_file_decoder.decode(raw) for raw in raws if raw is not None], more

    # ---- batches ----------------------------------------------------------------------------

    def create_batch(self, record: BatchRecord) -> None:
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.batches, record.id, msgspec.json.encode(record))
            pipe.zadd(self.keys.batch_order, {record.id: record.created_at * 1000 + _tiebreak()})
            pipe.sadd(self.keys.active_batches, record.id)
            pipe.execute()

    def batch(self, batch_id: str) -> BatchRecord | None:
        raw: Any = self.redis.hget(self.keys.batches, batch_id)
        return _batch_decoder.decode(raw) if raw is not None else None

    def counts(self, batch_ids: list[str]) -> dict[str, tuple[int, int]]:
        raws: list[Any] = self.redis.hmget(self.keys.batch_counts, batch_ids) if batch_ids else []
        found = {}
        for batch_id, raw in zip(batch_ids, raws, strict=True):
            if raw is not None:
                completed, failed = raw.split()
                found[batch_id] = (int(completed), int(failed))
        return found

    def set_counts(self, batch_id: str, completed: int, failed: int) -> None:
        self.redis.hset(self.keys.batch_counts, batch_id, f"{completed} {failed}")

    def batches(self, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        ids, more = self._page(self.keys.batch_order, after, limit, newest_first=True)
        raws: list[Any] = self.redis.hmget(self.keys.batches, ids) if ids else []
        return [_batch_decoder.decode(raw) for raw in raws if raw is not None], more

    def active(self) -> list[str]:
        members: Any = self.redis.smembers(self.keys.active_batches)
        return sorted(member.decode() for member in members)

    def move(
        self, batch_id: str, allowed: frozenset[str], change: Callable[[BatchRecord], None]
    ) -> tuple[BatchRecord | None, bool]:
        """Apply ``change`` to the record when its status is in ``allowed``; (the record as it
        is now, whether it changed). A record that reaches a final status leaves the active set."""
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(self.keys.batches)
                    raw: Any = pipe.hget(self.keys.batches, batch_id)
                    if raw is None:
                        return None, False
                    record = _batch_decoder.decode(raw)
                    if record.status not in allowed:
                        return record, False
                    change(record)
                    pipe.multi()
                    pipe.hset(self.keys.batches, batch_id, msgspec.json.encode(record))
                    if record.status in FINAL:
                        pipe.srem(self.keys.active_batches, batch_id)
                        pipe.hdel(self.keys.batch_counts, batch_id)
                    pipe.execute()
                    return record, True
                except redis.WatchError:
                    continue

    def _page(self, key: str, after: str | None, limit: int, newest_first: bool) -> tuple[list[str], bool]:
        """Up to ``limit`` ids of an order set after the id ``after`` (None: from the start), and
        whether more follow. An ``after`` not in the set starts from the beginning."""
        start = 0
        if after is not None:
            rank: Any = self.redis.zrevrank(key, after) if newest_first else self.redis.zrank(key, after)
            start = rank + 1 if rank is not None else 0
        read = self.redis.zrevrange if newest_first else self.redis.zrange
        members: Any = read(key, start, start + limit)
        ids = [member.decode() for member in members]
        return ids[:limit], len(ids) > limit


def _tiebreak() -> int:
    """The milliseconds within the second: records created in one second keep their order."""
    return int(time.time() * 1000) % 1000
