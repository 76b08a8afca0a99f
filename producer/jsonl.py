"""JSONL input files: lines -> validated Jobs, or Rejected rows (producer.input_rows). The raw
lines are read by producer.input_lines; Results become output lines in producer.output_lines.

An input line is one native job::

    {"id": "q1", "prompt": "...", "max_tokens": 32, "metadata": {...}}
    {"id": "q2", "messages": [{"role": "user", "content": "..."}], "temperature": 0}
    {"id": "q3", "input_ids": [1, 2, 3]}

with the sampling fields at top level, or one OpenAI Batch request line (see openai_batch).
A line without an id gets a deterministic one from its line number and content, so the same
file enqueued twice yields the same ids (and enqueue skips them the second time).

A line that is not a runnable job is Rejected: it still gets one output row, an ``invalid_job``
error row (an OpenAI error line with its ``custom_id`` when the line was an OpenAI request),
under its own id when that is usable, else a derived one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from producer import openai_batch
from producer.input_lines import open_binary, read_lines
from producer.input_rows import InputFile, Rejected, derive_id
from wire.nesting import json_outline
from wire.schema import (
    MAX_JOB_BYTES,
    Job,
    JobError,
    SamplingParams,
    encode_job,
    nesting_error,
    validation_error,
)

SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
_JOB_FIELDS = frozenset({"id", "prompt", "messages", "input_ids", "prompts", "metadata", "model"})


def parse_line(text: str, line_no: int) -> Job:
    """Validate one input line; raises JobError naming the field and why, never anything else."""
    return _parse_line(text, line_no)[0]


# a \uD800-\uDBFF escape (not itself escaped) that no \uDC00-\uDFFF escape follows, or a lone low half
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)


def json_error(text: str, exc: Exception) -> JobError:
    """A line that is not valid JSON, and why. NOTE: msgspec reports a lone UTF-16 surrogate
    escape (\ud800 without its pair) as "Input data was truncated": said here as what it is."""
    lone = _LONE_SURROGATE.search(text)
    if lone is not None:
        escape = lone.group(1)
        return JobError(
            "json",
            None,
            f"{escape} at character {lone.start(1) + 1} is half a UTF-16 surrogate pair, not a character",
        )
    return JobError("json", None, f"not valid JSON: {exc}")


def _parse_line(text: str, line_no: int) -> tuple[Job, list[str]]:
    """parse_line's job, and the OpenAI request fields the line carries that are ignored."""
    try:
        size = len(text.rstrip("\r\n").encode())
    except UnicodeEncodeError as exc:
        raise JobError(
            "encoding", None, f"not valid UTF-8: {exc.reason} at character {exc.start + 1}"
        ) from None
    if size > MAX_JOB_BYTES:
        raise JobError("payload", f"{size} bytes", f"line exceeds the limit of {MAX_JOB_BYTES} bytes")
    try:
        raw = msgspec.json.decode(text)
    except RecursionError:
        raise nesting_error(json_outline(text)) from None
    except msgspec.DecodeError as exc:
        raise json_error(text, exc) from None
    if not isinstance(raw, dict):
        raise JobError("json", None, f"must be a JSON object, got {type(raw).__name__}")
    try:
        return _job(raw, text, line_no)
    except JobError:
        raise
    except Exception as exc:  # NOTE: the input boundary: a surprise here is this line's error
        raise JobError("json", None, f"unreadable: {type(exc).__name__}: {exc}") from None


def _job(raw: dict[str, Any], text: str, line_no: int) -> tuple[Job, list[str]]:
    fields, ignored = (
        openai_batch.job_fields(raw) if openai_batch.is_batch_request(raw) else (_native_fields(raw), [])
    )
    if "id" not in fields:
        fields["id"] = derive_id(text, line_no)
    job_id = fields["id"] if isinstance(fields["id"], str) else None
    sampling = {key: fields.pop(key) for key in list(fields) if key in SAMPLING_FIELDS}
    key = _sampling_key(sampling)
    known = _sampling_seen.get(key) if key is not None else None
    try:
        job = msgspec.convert({**fields, "sampling": known if known is not None else sampling}, Job)
    except msgspec.ValidationError as exc:
        error = validation_error(exc, job_id)
        raise JobError(
            error.field.removeprefix("sampling."), error.value, error.reason, error.job_id
        ) from None
    encode_job(job)  # the size limit, on the encoded form
    if key is not None and known is None:
        if len(_sampling_seen) >= _SAMPLING_SEEN_MAX:
            _sampling_seen.clear()
        _sampling_seen[key] = job.sampling
    return job, ignored


# Sampling fields seen on valid lines -> their SamplingParams, validated once: the lines of a
# file mostly share them. The key holds each value's type (1, 1.0 and true are equal in Python
# but not as a field's value); a line with a list or object among them is not kept.
_SAMPLING_SEEN_MAX = 256
_sampling_seen: dict[tuple[tuple[str, type, Any], ...], SamplingParams] = {}


def _sampling_key(sampling: dict[str, Any]) -> tuple[tuple[str, type, Any], ...] | None:
    key = tuple((name, type(value), value) for name, value in sampling.items())
    try:
        hash(key)
    except TypeError:
        return None
    return key


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
    """Every line of ``path`` (JSONL, or gzip-compressed JSONL: told by its magic bytes)
    validated. Blank lines are ignored, a UTF-8 byte order mark on the first line is skipped;
    invalid UTF-8, over-long lines and duplicate ids are rejected with their line number. A
    file that cannot be read to its end (a truncated gzip stream) keeps the lines read before
    the damage and gets one rejection at the line where reading stopped."""
    parsed = InputFile()
    for _ in iter_jobs(path, parsed):
        pass
    return parsed


def iter_jobs(path: str | Path, parsed: InputFile) -> Iterator[Job | Rejected]:
    """read_jobs, one row at a time as it is read (``parsed`` counts them and keeps what its
    ``keep_rows`` says).

    A file is an OpenAI batch file when its first line that is a JSON object is an OpenAI
    request: then its lines that are not JSON objects get OpenAI error lines too, with a null
    ``custom_id`` (as OpenAI's). Such lines before that first object wait for it (in input
    order); in a file without any object they come at the end as radixq error rows."""
    held: list[tuple[int, str, str | None]] = []  # (line, reason, id) of lines not yet placed
    file_url: str | None = None
    known = False  # whether the file's format is known (file_url None: radixq's own lines)

    def placed() -> Iterator[Rejected]:
        for line_no, reason, job_id in held:
            yield parsed.reject(line_no, reason, job_id, file_url, unnamed=file_url is not None)
        held.clear()

    with open_binary(path) as stream:
        for line_no, text in read_lines(stream):
            if isinstance(text, JobError):  # not text: no object either
                job_id, url, is_object, reason = None, None, False, str(text)
            elif not text.strip():
                continue
            else:
                try:
                    job, ignored = _parse_line(text, line_no)
                except JobError as exc:
                    (job_id, url, is_object), reason = _row_identity(text, exc), str(exc)
                else:
                    reason = ""
            if reason:
                if not is_object and not known:
                    held.append((line_no, reason, job_id))
                    continue
                if not known:
                    known, file_url = True, url
                    yield from placed()
                if not is_object and file_url is not None:
                    yield parsed.reject(line_no, reason, None, file_url, unnamed=True)
                    continue
                yield parsed.reject(line_no, reason, job_id, url)
                continue
            if not known:
                known, file_url = True, (job.metadata.get(openai_batch.RESERVED_KEY) or {}).get("url")
                yield from placed()
            for name in ignored:
                parsed.ignored[name] = parsed.ignored.get(name, 0) + 1
            yield parsed.add_job(job, line_no)
    yield from placed()


def _row_identity(text: str, exc: JobError) -> tuple[str | None, str | None, bool]:
    """(the id its error row can take, its OpenAI url, whether the line is a JSON object) of a
    rejected line, as far as they can be read: an id that is itself the error is not taken."""
    try:
        raw = msgspec.json.decode(text)
    except Exception:  # NOTE: undecodable or nested too deep: only the error's id is known
        return (exc.job_id if exc.field not in ("id", "custom_id") else None), None, False
    if not isinstance(raw, dict):
        return None, None, False
    if openai_batch.is_batch_request(raw):
        url = raw.get("url")
        url = url if url in (openai_batch.CHAT_URL, openai_batch.COMPLETIONS_URL) else openai_batch.CHAT_URL
        return (raw.get("custom_id") if exc.field != "custom_id" else None), url, True
    return (raw.get("id") if exc.field != "id" else None), None, True
