"""The rows of one input file (JSONL, Parquet or CSV), in order: each a valid Job or a Rejected
line that still gets its ``invalid_job`` error row; ids unique across them (a repeated one is
rejected as a duplicate), a row without a usable id given one derived from its position.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from producer import openai_batch
from wire.schema import Job, Result, bounded_id, error_result

_DERIVED_DIGITS = 16  # hex digits of a derived id's hash (L<line>-<digits>)


@dataclass(frozen=True)
class Rejected:
    """One input line (or dataset row, ``unit``) that is not a runnable job; ``job_id`` names
    its error row, ``openai_url`` is set when that row is to be an OpenAI batch error line."""

    line_no: int
    reason: str
    job_id: str
    openai_url: str | None = None
    unit: str = "line"
    own_id: bool = True  # job_id is the line's own (id, custom_id), not one derived from it

    def __str__(self) -> str:
        return f"{self.unit} {self.line_no}: {self.reason}"

    def error_result(self) -> Result:
        """Its ``invalid_job`` error row, in the format of the line: an OpenAI error line's
        ``custom_id`` is null when the line gave none that could be read (as OpenAI's)."""
        metadata: dict[str, Any] = {}
        if self.openai_url is not None:
            info = {"format": "openai", "url": self.openai_url, "model": ""}
            metadata[openai_batch.RESERVED_KEY] = info if self.own_id else {**info, "unnamed": True}
        message = f"{self.unit} {self.line_no}: {self.reason}"
        return error_result(self.job_id, "invalid_job", message, metadata=metadata)


@dataclass
class InputFile:
    """The rows of one input file in line order (``rows``: each a Job or a Rejected line), the
    same split into ``jobs`` and ``rejected``, and the OpenAI request fields that were accepted
    and ignored (field -> number of lines).

    ``keep_rows`` False (a streaming reader: ``iter_jobs``, ``datasets.iter_input``) keeps only
    the rejected rows and the counts: the jobs go on as they are read. Either way it keeps the
    line of each id a row gave (for "duplicate of line N"), except derived ones, which are
    unique by their line number."""

    rows: list[Job | Rejected] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    ignored: dict[str, int] = field(default_factory=dict)
    keep_rows: bool = True
    num_jobs: int = 0
    num_rows: int = 0
    _first_row_of: dict[str, int] = field(default_factory=dict, repr=False)

    def notes(self) -> list[str]:
        """One line per ignored OpenAI request field, for the enqueue summary."""
        return [
            f"body.{name} on {count} line{'s' * (count != 1)}: accepted and ignored (docs/guide.md: OpenAI request fields)"
            for name, count in sorted(self.ignored.items())
        ]

    def add_job(self, job: Job, line_no: int, unit: str = "line") -> Job | Rejected:
        """Add a valid job, or reject it as a duplicate of an earlier row's id; the row added."""
        if job.id in self._first_row_of:
            reason = f"job {job.id!r}: id: duplicate of {unit} {self._first_row_of[job.id]}"
            format_info = job.metadata.get(openai_batch.RESERVED_KEY) or {}
            return self.reject(line_no, reason, None, format_info.get("url"), unit)  # its id: derived
        self._note_id(job.id, line_no)
        self.num_jobs += 1
        self.num_rows += 1
        if self.keep_rows:
            self.rows.append(job)
            self.jobs.append(job)
        return job

    def reject(
        self,
        line_no: int,
        reason: str,
        job_id: str | None,
        openai_url: str | None,
        unit: str = "line",
        *,
        unnamed: bool = False,
    ) -> Rejected:
        """Add a rejected row; its error row takes ``job_id`` when it is usable and not taken,
        else an id derived from its position and reason (``unnamed``: derived in any case, an
        OpenAI line whose custom_id could not be read). Returns it."""
        own_id = (
            not unnamed
            and job_id is not None
            and bounded_id(job_id) is not None
            and job_id not in self._first_row_of
        )
        if not own_id:
            job_id = derive_id(reason, line_no)
        assert job_id is not None
        self._note_id(job_id, line_no)
        rejected = Rejected(line_no, reason, job_id, openai_url, unit, own_id)
        self.num_rows += 1
        if self.keep_rows:
            self.rows.append(rejected)
        self.rejected.append(rejected)
        return rejected

    def _note_id(self, job_id: str, line_no: int) -> None:
        prefix = f"L{line_no}-"
        if not (job_id.startswith(prefix) and len(job_id) == len(prefix) + _DERIVED_DIGITS):
            self._first_row_of[job_id] = line_no  # NOTE: a derived id is unique by its line


def derive_id(text: str, line_no: int) -> str:
    digest = hashlib.sha256(f"{line_no}\n{text.strip()}".encode()).hexdigest()[:_DERIVED_DIGITS]
    return f"L{line_no}-{digest}"
