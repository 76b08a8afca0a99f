"""Pipelines in Python: submit a batch of rows to a queue, iterate the results as they finish.

    pipe = Pipeline("redis://localhost:6379/0", queue="qa")
    batch = pipe.submit(rows, ColumnMapping(template="Q: {question}\\nA:"))
    for result in batch.as_completed(timeout_s=600):
        ...
    batch.cancel()                                   # the rows without a result: cancelled
    df = pipe.generate_dataframe(df, ColumnMapping(prompt_column="question"))   # pandas
    ds = ds.map(pipe.batch_function(ColumnMapping(prompt_column="question")),
                batched=True, with_indices=True)                               # HF datasets

A row is a Job or a dict of columns, made into a job the way a dataset file's row is
(producer.datasets): same column mapping and template, same deterministic ids (the id
column, else the row's position and content), so submitting the same rows again enqueues
nothing new and finds the results already there: a script that crashed resumes by running
again. A row that cannot be a job gets its ``invalid_job`` error result, like a rejected
line. Workers run the jobs (``radixq worker``); results are read from Redis, not trimmed,
so a pipeline must not share its queue with a ``radixq collect --trim`` (the default).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from producer.cancel import CancelReport
from producer.client import Client, ContentChanged
from producer.datasets import NATIVE_COLUMNS, ColumnMapping, row_job
from producer.forget import unrecorded
from producer.input_rows import InputFile
from producer.output_lines import output_record
from producer.resume import done_marks
from producer.tables import RESULT_COLUMNS, result_columns
from wire.keys import DEFAULT_QUEUE, FIELD_ENTRY, FIELD_ID, FIELD_RESULT
from wire.schema import Job, JobError, Result, decode_result

_READ_COUNT = 1000


class ResultsGone(LookupError):
    """Jobs that finished, whose results are no longer in Redis (trimmed by a collect)."""


def to_rows(rows: Iterable[Job | dict[str, Any]], mapping: ColumnMapping, first_row: int = 1) -> InputFile:
    """Jobs and rejected rows, in order; ``first_row`` numbers the first (for derived ids)."""
    mapping.check()
    parsed = InputFile()
    for row_no, row in enumerate(rows, start=first_row):
        if isinstance(row, Job):
            parsed.add_job(row, row_no, unit="row")
            continue
        try:
            parsed.add_job(row_job(row, row_no, mapping), row_no, unit="row")
        except JobError as exc:
            job_id = row.get(mapping.id_column or "id")
            parsed.reject(row_no, str(exc), str(job_id) if job_id is not None else None, None, unit="row")
    return parsed


@dataclass
class Batch:
    """Submitted rows: ``ids`` in row order (one per row), ``enqueued``/``skipped`` as enqueue
    reported them (skipped: submitted before)."""

    pipeline: Pipeline
    ids: list[str]
    enqueued: int
    skipped: int
    rejected: int
    rerun: int = 0  # submitted before with other content, run again (rerun_changed)

    def as_completed(self, timeout_s: float | None = None, poll_s: float = 0.5) -> Iterator[Result]:
        """Each row's result once, as it finishes (those finished before first). Raises
        TimeoutError when ``timeout_s`` passes first, ResultsGone for results trimmed away."""
        return self.pipeline.results(self.ids, timeout_s=timeout_s, poll_s=poll_s)

    def results(self, timeout_s: float | None = None) -> list[Result]:
        """Every row's result, in row order (waits for all)."""
        found = {result.id: result for result in self.as_completed(timeout_s)}
        return [found[job_id] for job_id in self.ids]

    def cancel(self) -> CancelReport:
        """Cancel the rows that have no result yet (Client.cancel): each then has a
        ``cancelled`` error result, so ``as_completed`` ends with every row once."""
        return self.pipeline.client.cancel(self.ids)


class Pipeline:
    """A queue seen from a pipeline: submit rows, read their results."""

    def __init__(self, redis_url: str, queue: str = DEFAULT_QUEUE, *, retry_timeout_s: float = 60.0) -> None:
        self.client = Client.from_url(redis_url, queue, retry_timeout_s=retry_timeout_s)
        self.keys = self.client.keys

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        rows: Iterable[Job | dict[str, Any]],
        mapping: ColumnMapping = NATIVE_COLUMNS,
        first_row: int = 1,
        *,
        rerun_changed: bool = False,
    ) -> Batch:
        """Enqueue the rows (idempotent by id); raises EnqueueStopped like Client.enqueue, and
        ContentChanged, before enqueueing anything, for ids submitted before with other
        content (a changed prompt under an id column), unless ``rerun_changed``."""
        parsed = to_rows(rows, mapping, first_row)
        items: list[Job | Result] = [
            row if isinstance(row, Job) else row.error_result() for row in parsed.rows
        ]
        rejected = {row.job_id for row in parsed.rejected}
        report = self.client.enqueue(items, rerun_changed=rerun_changed, refuse_changed=True)
        if report.changed:  # still queued or running with their first content
            raise ContentChanged(report.changed, "they were submitted", ": they are not done yet")
        return Batch(
            self,
            [item.id for item in items],
            enqueued=sum(i not in rejected for i in report.enqueued),
            skipped=sum(i not in rejected for i in report.skipped),
            rejected=len(rejected),
            rerun=len(report.rerun),
        )

    def results(
        self, ids: Iterable[str], timeout_s: float | None = None, poll_s: float = 0.5
    ) -> Iterator[Result]:
        """The counted result of each id, once, in the order they appear in Redis."""
        waiting = set(ids)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_entry, block_ms, checked = "0-0", None, False
        while waiting:
            marks = done_marks(self.client.redis, self.keys, sorted(waiting)) if not checked else {}
            found, last_entry = self._read(waiting, last_entry, block_ms)
            for result in found:
                waiting.discard(result.id)
                yield result
            if not checked:  # NOTE: done before the first full read, yet not in the stream: trimmed
                gone = sorted(
                    {i for i in marks if i in waiting}
                    | set(unrecorded(self.client.redis, self.keys, sorted(waiting)))
                )
                if gone:
                    raise ResultsGone(
                        f"{len(gone)} results were trimmed from Redis by a collect, e.g. {gone[:3]}"
                    )
                checked = True
            if waiting and deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{len(waiting)} of the jobs have no result after {timeout_s:g} s")
            block_ms = max(1, int(poll_s * 1000))

    def _read(self, waiting: set[str], last_entry: str, block_ms: int | None) -> tuple[list[Result], str]:
        """Results of ``waiting`` ids from ``last_entry`` to the stream's end (blocking up to
        ``block_ms`` for the first entry), and the last entry read."""
        found: list[Result] = []
        while True:
            reply: Any = self.client.redis.xread(
                {self.keys.results: last_entry}, count=_READ_COUNT, block=block_ms
            )
            if not reply:
                return found, last_entry
            entries = reply[0][1]
            job_ids = [fields.get(FIELD_ID.encode(), b"").decode(errors="replace") for _, fields in entries]
            mine = [(e, f, i) for (e, f), i in zip(entries, job_ids, strict=True) if i in waiting]
            marks: list[Any] = (
                self.client.redis.hmget(self.keys.done, [i for _, _, i in mine]) if mine else []
            )
            for (_, fields, _), mark in zip(mine, marks, strict=True):
                if mark is not None and mark == fields.get(FIELD_ENTRY.encode()):
                    found.append(decode_result(fields[FIELD_RESULT.encode()]))
            last_entry = entries[-1][0].decode()
            if len(entries) < _READ_COUNT:
                return found, last_entry
            block_ms = None

    def generate_columns(
        self,
        rows: Iterable[Job | dict[str, Any]],
        mapping: ColumnMapping = NATIVE_COLUMNS,
        *,
        first_row: int = 1,
        timeout_s: float | None = None,
    ) -> dict[str, list[Any]]:
        """Submit the rows and wait: the result columns (producer.tables.RESULT_COLUMNS), one
        value per row, in row order."""
        batch = self.submit(rows, mapping, first_row)
        results = batch.results(timeout_s)
        records = [result_columns(output_record(result)) for result in results]
        return {name: [record[name] for record in records] for name in RESULT_COLUMNS}

    def generate_dataframe(
        self, frame: Any, mapping: ColumnMapping = NATIVE_COLUMNS, *, timeout_s: float | None = None
    ) -> Any:
        """A pandas DataFrame in, a copy with the result columns added out (a result column
        whose name the frame already uses is prefixed ``result_``)."""
        columns = self.generate_columns(frame.to_dict("records"), mapping, timeout_s=timeout_s)
        out = frame.copy()
        for name, values in columns.items():
            out["result_" + name if name in frame.columns else name] = values
        return out

    def batch_function(
        self, mapping: ColumnMapping = NATIVE_COLUMNS, *, timeout_s: float | None = None
    ) -> Callable[..., dict[str, list[Any]]]:
        """A function for Hugging Face ``Dataset.map(fn, batched=True, with_indices=True)``:
        a batch (column -> values) in, its result columns out. With indices, rows without an
        id column get the same ids in every run (their position in the dataset)."""

        def generate(batch: dict[str, list[Any]], indices: list[int] | None = None) -> dict[str, list[Any]]:
            names = list(batch)
            size = len(batch[names[0]]) if names else 0
            rows = [{name: batch[name][i] for name in names} for i in range(size)]
            first = indices[0] + 1 if indices else 1
            if indices and indices != list(range(indices[0], indices[0] + size)):
                raise ValueError("batch_function: the batch's indices are not consecutive")
            columns = self.generate_columns(rows, mapping, first_row=first, timeout_s=timeout_s)
            return {("result_" + k if k in batch else k): v for k, v in columns.items()}

        return generate
