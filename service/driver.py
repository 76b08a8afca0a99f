"""One batch, from its input file to its output and error files, by the one service that holds
its lock.

    lock       the output lock (producer.outlock) of the batch's rows file in the work folder:
               one service drives a batch; the lock goes with its process (kill -9 too), and
               another service's supervisor takes the batch over on its next look
    enqueue    every line of the input file, as ``radixq enqueue`` reads it, onto the queue with
               the batch id as tag; job id ``<batch id>/<custom_id>``; a line whose request is
               not runnable goes in as its invalid_job result. Idempotent: a service that takes
               over enqueues again and every id is skipped
    collect    the batch's ids into the rows file (producer.collector: spilled, exactly once,
               resumed from the rows file and the spill), counting rows as they come
    cancel     a cancel asked for (status ``cancelling``) or the window passed: the queue's own
               cancel of the batch's tag (Client.cancel), then collect goes on until every id
               has its row: the finished ones as they were, the others ``cancelled``
    finalize   the rows split into the output and error files (service.finalize), the record
               moved to its final status, the work files removed

Every step can be repeated after a crash at any point: the lock is taken again, the record read
again, and a batch found final has only its leftover work files removed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import redis

from producer.cancel import CancelLost
from producer.client import Client, ContentChanged, EnqueueStopped
from producer.collector import Collector
from producer.input_rows import InputFile, Rejected
from producer.jsonl import iter_jobs
from producer.outfile import OutputFileError
from producer.outlock import OutputBusy, output_lock
from producer.progress import Progress
from producer.spill import spill_path
from service.finalize import split_rows
from service.records import ACTIVE, FINAL, BatchError, BatchRecord, FileRecord, Records, now_s
from service.storage import Storage
from wire.schema import Job, Result

log = logging.getLogger("radixq.serve")
COUNTS_EVERY_S = 0.5  # live request counts are written at most this often


def job_prefix(batch_id: str) -> str:
    return batch_id + "/"


def input_name(file_id: str) -> str:
    return f"{file_id}.jsonl"


def output_ids(batch_id: str) -> tuple[str, str]:
    """The ids of a batch's output and error files (fixed: a finalize done twice writes the same)."""
    tail = batch_id.removeprefix("batch_")
    return f"file-{tail}-output", f"file-{tail}-errors"


class BatchDriver:
    def __init__(
        self,
        client: redis.Redis,
        queue: str,
        records: Records,
        storage: Storage,
        work_dir: Path,
        batch_id: str,
        stopping: threading.Event,
        poll_s: float = 0.5,
        retry_timeout_s: float = 60.0,
    ) -> None:
        self.redis = client
        self.queue = queue
        self.records = records
        self.storage = storage
        self.work_dir = work_dir
        self.batch_id = batch_id
        self.stopping = stopping
        self.poll_s = poll_s
        self.retry_timeout_s = retry_timeout_s
        self.rows_path = work_dir / f"{batch_id}.rows.jsonl"
        self.prefix = job_prefix(batch_id)
        self._counted = (-1, -1)
        self._counted_at = 0.0

    def run(self) -> bool:
        """Drive the batch as far as it goes now; False when another service holds it."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            with output_lock(self.rows_path):
                self._drive()
        except OutputBusy:
            return False
        except redis.RedisError as exc:  # NOTE: left to the next look (this service or another)
            log.warning("batch %s: Redis error, will try again: %s", self.batch_id, exc)
        return True

    def _drive(self) -> None:
        record = self.records.batch(self.batch_id)
        if record is None or record.status in FINAL:
            self._remove_work_files()
            return
        try:
            ids = self._enqueue(record)
        except FileNotFoundError:
            self._fail("input_file_missing", f"the input file {record.input_file_id} is no longer in storage")
            return
        except ContentChanged as exc:
            self._fail("invalid_request", str(exc))
            return
        except EnqueueStopped as exc:
            log.warning("batch %s: enqueue stopped (%s); will try again", self.batch_id, exc.cause)
            return
        self.records.move(self.batch_id, frozenset({"validating"}), lambda r: _started(r, len(ids)))
        try:
            self._collect(ids)
        except CancelLost as exc:
            self._fail("queue_lost", str(exc))
        except OutputFileError as exc:  # NOTE: the rows file was changed by hand: it cannot be trusted
            self._fail("rows_file_damaged", str(exc))

    def _enqueue(self, record: BatchRecord) -> list[str]:
        """Put every line of the input on the queue (tagged); the batch's job ids in input order."""
        ids: list[str] = []
        client = Client(self.redis, self.queue, retry_timeout_s=self.retry_timeout_s, say=log.warning)
        with self.storage.local(input_name(record.input_file_id), self.work_dir / "inputs") as path:
            client.enqueue(self._rows(path, ids), keep_ids=False, tag=self.batch_id)
        return ids

    def _rows(self, path: Path, ids: list[str]) -> Iterator[Job | Result]:
        for row in iter_jobs(path, InputFile(keep_rows=False)):
            item: Job | Result = row.error_result() if isinstance(row, Rejected) else row
            job_id = self.prefix + item.id
            ids.append(job_id)
            yield msgspec.structs.replace(item, id=job_id)

    def _collect(self, ids: list[str]) -> None:
        collector = Collector(self.redis, self.queue, say=log.warning, retry_timeout_s=self.retry_timeout_s)
        progress = Progress(quiet=True)
        cancelled = False
        while not self.stopping.is_set():
            record = self.records.batch(self.batch_id)
            if record is None or record.status in FINAL:
                return
            ending = record.status == "cancelling" or time.time() >= record.expires_at
            if ending and not cancelled:
                Client(self.redis, self.queue, retry_timeout_s=self.retry_timeout_s).cancel(tag=self.batch_id)
                cancelled = True

            def stop(cancelled: bool = cancelled) -> bool:
                self._count(progress)
                return self.stopping.is_set() or (not cancelled and self._ending())

            report = collector.collect(
                self.rows_path, ids=ids, wait=True, poll_s=self.poll_s, should_stop=stop, progress=progress
            )
            if report.lost is not None:
                self._fail("queue_lost", report.lost)
                return
            if report.trimmed:
                self._fail(
                    "results_trimmed",
                    f"the results of {len(report.trimmed)} requests were removed from Redis by another "
                    "collect (collect --trim on this queue) before this service read them",
                )
                return
            if not report.missing and not report.held:
                self._finalize()
                return

    def _ending(self) -> bool:
        record = self.records.batch(self.batch_id)
        return record is None or record.status == "cancelling" or time.time() >= record.expires_at

    def _count(self, progress: Progress) -> None:
        """Write the live request counts when they moved (at most every COUNTS_EVERY_S)."""
        snapshot = progress.snapshot()
        counted = (snapshot.done - snapshot.failed, snapshot.failed)
        now = time.monotonic()
        if counted != self._counted and now - self._counted_at >= COUNTS_EVERY_S:
            self.records.set_counts(self.batch_id, *counted)
            self._counted, self._counted_at = counted, now

    def _finalize(self) -> None:
        record = self.records.batch(self.batch_id)
        if record is None or record.status in FINAL:
            return
        # NOTE: a batch already finalizing had every row before its window passed
        expired = record.status in ("validating", "in_progress") and time.time() >= record.expires_at
        if record.status == "in_progress" and not expired:
            record, _ = self.records.move(self.batch_id, frozenset({"in_progress"}), _finalizing)
            if record is None:
                return
        output_id, error_id = output_ids(self.batch_id)
        split = split_rows(
            self.rows_path, self.storage, input_name(output_id), input_name(error_id), self.prefix, expired
        )
        created = now_s()
        for file_id, rows, kind in (
            (output_id, split.completed, "output"),
            (error_id, split.failed, "errors"),
        ):
            if rows:
                size = self.storage.size(input_name(file_id))
                name = f"{self.batch_id}_{kind}.jsonl"
                self.records.put_file(FileRecord(id=file_id, bytes=size, created_at=created, filename=name,
                                                 purpose="batch_output", lines=rows))  # fmt: skip
            else:
                self.storage.delete(input_name(file_id))

        def final(r: BatchRecord) -> None:
            at = now_s()
            if r.status == "cancelling":
                r.status, r.cancelled_at = "cancelled", at
            elif expired:
                r.status, r.expired_at = "expired", at
            else:
                r.status, r.completed_at = "completed", at
            r.completed, r.failed = split.completed, split.failed
            r.output_file_id = output_id if split.completed else None
            r.error_file_id = error_id if split.failed else None

        self.records.move(self.batch_id, ACTIVE, final)
        log.info(
            "batch %s: %d rows in the output file, %d in the error file",
            self.batch_id,
            split.completed,
            split.failed,
        )
        self._remove_work_files()

    def _fail(self, code: str, message: str) -> None:
        log.error("batch %s failed: %s", self.batch_id, message)

        def failed(r: BatchRecord) -> None:
            r.status, r.failed_at = "failed", now_s()
            r.errors = [*r.errors, BatchError(code=code, message=message)]

        self.records.move(self.batch_id, ACTIVE, failed)

    def _remove_work_files(self) -> None:
        for path in (self.rows_path, spill_path(self.rows_path)):
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)


def _started(record: BatchRecord, total: int) -> None:
    record.status, record.in_progress_at, record.total = "in_progress", now_s(), total


def _finalizing(record: BatchRecord) -> None:
    record.status, record.finalizing_at = "finalizing", now_s()
