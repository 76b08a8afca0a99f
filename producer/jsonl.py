"""JSONL files: input lines -> validated Jobs, Results -> output lines.

An input line is one native job::

    {"id": "q1", "prompt": "...", "max_tokens": 32, "metadata": {...}}
    {"id": "q2", "messages": [{"role": "user", "content": "..."}], "temperature": 0}
    {"id": "q3", "input_ids": [1, 2, 3]}

with the sampling fields at top level, or one OpenAI Batch request line (see openai_batch).
A line without an id gets a deterministic one from its line number and content, so the same
file enqueued twice yields the same ids (and enqueue skips them the second time).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from producer import openai_batch
from producer.schema import MAX_JOB_BYTES, Job, JobError, Result, SamplingParams, encode_job, validation_error

SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
_JOB_FIELDS = frozenset({"id", "prompt", "messages", "input_ids", "metadata"})


@dataclass(frozen=True)
class Rejected:
    """One input line that is not a runnable job."""

    line_no: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.reason}"


@dataclass
class InputFile:
    """The jobs of one input file in line order, and the lines that were rejected."""

    jobs: list[Job] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)


def derive_id(text: str, line_no: int) -> str:
    digest = hashlib.sha256(f"{line_no}\n{text.strip()}".encode()).hexdigest()[:16]
    return f"L{line_no}-{digest}"


def parse_line(text: str, line_no: int) -> Job:
    """Validate one input line; raises JobError naming the field and why."""
    if len(text.encode()) > MAX_JOB_BYTES:
        raise JobError(
            "payload", f"{len(text.encode())} bytes", f"line exceeds the limit of {MAX_JOB_BYTES} bytes"
        )
    try:
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise JobError("json", None, f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise JobError("json", None, f"must be a JSON object, got {type(raw).__name__}")
    fields = openai_batch.job_fields(raw) if openai_batch.is_batch_request(raw) else _native_fields(raw)
    if "id" not in fields:
        fields["id"] = derive_id(text, line_no)
    job_id = fields["id"] if isinstance(fields["id"], str) else None
    sampling = {key: fields.pop(key) for key in list(fields) if key in SAMPLING_FIELDS}
    try:
        job = msgspec.convert({**fields, "sampling": sampling}, Job)
    except msgspec.ValidationError as exc:
        error = validation_error(exc, job_id)
        raise JobError(error.field.removeprefix("sampling."), error.value, error.reason, job_id) from None
    encode_job(job)  # the size limit, on the encoded form
    return job


def _native_fields(raw: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(raw) - _JOB_FIELDS - SAMPLING_FIELDS)
    if unknown:
        allowed = ", ".join(sorted(_JOB_FIELDS | SAMPLING_FIELDS))
        raise JobError(
            unknown[0], raw[unknown[0]], f"unknown field (allowed: {allowed})", _str_or_none(raw.get("id"))
        )
    metadata = raw.get("metadata")
    if isinstance(metadata, dict) and openai_batch.RESERVED_KEY in metadata:
        raise JobError(f"metadata.{openai_batch.RESERVED_KEY}", None, "is reserved for radixq")
    return dict(raw)


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def read_jobs(path: str | Path) -> InputFile:
    """Every line of ``path`` validated; blank lines are ignored, duplicate ids rejected."""
    parsed = InputFile()
    first_line_of: dict[str, int] = {}
    with open(path, encoding="utf-8", errors="replace") as lines:
        for line_no, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                job = parse_line(text, line_no)
            except JobError as exc:
                parsed.rejected.append(Rejected(line_no, str(exc)))
                continue
            if job.id in first_line_of:
                reason = f"job {job.id!r}: id: duplicate of line {first_line_of[job.id]}"
                parsed.rejected.append(Rejected(line_no, reason))
                continue
            first_line_of[job.id] = line_no
            parsed.jobs.append(job)
    return parsed


def output_record(result: Result) -> dict[str, Any]:
    """The output line (as a dict) for one result, in the format its job came in."""
    metadata = dict(result.metadata)
    format_info = metadata.pop(openai_batch.RESERVED_KEY, None)
    if isinstance(format_info, dict) and format_info.get("format") == "openai":
        return openai_batch.response_line(result, format_info, metadata)
    return {
        "id": result.id,
        "choices": [msgspec.to_builtins(choice) for choice in result.choices],
        "usage": msgspec.to_builtins(result.usage),
        "metadata": metadata,
        "error": msgspec.to_builtins(result.error),
    }


def output_line(result: Result) -> bytes:
    return msgspec.json.encode(output_record(result)) + b"\n"


def written_ids(path: str | Path) -> set[str]:
    """Ids already in an output file (``id`` or ``custom_id``); a torn last line is cut off."""
    path = Path(path)
    if not path.exists():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as out:
            out.truncate(data.rfind(b"\n") + 1)
        data = data[: data.rfind(b"\n") + 1]
    ids: set[str] = set()
    for line in data.splitlines():
        if line.strip():
            record = msgspec.json.decode(line)
            ids.add(record.get("custom_id") or record["id"])
    return ids
