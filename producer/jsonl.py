"""JSONL files: input lines -> validated Jobs, Results -> output lines.

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

import gzip
import hashlib
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec

from producer import openai_batch
from wire.nesting import json_outline
from wire.schema import (
    MAX_JOB_BYTES,
    Choice,
    Job,
    JobError,
    Result,
    SamplingParams,
    bounded_id,
    encode_job,
    error_result,
    nesting_error,
    validation_error,
)

SAMPLING_FIELDS = frozenset(SamplingParams.__struct_fields__)
_JOB_FIELDS = frozenset({"id", "prompt", "messages", "input_ids", "prompts", "metadata", "model"})
_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_LINE_READ_LIMIT = MAX_JOB_BYTES + len(_BOM) + 2  # the longest acceptable line with its BOM and CRLF
_SKIP_PIECE_BYTES = 1 << 16
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
            not unnamed and job_id is not None and bounded_id(job_id) is not None and job_id not in self._first_row_of
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


@contextmanager
def open_binary(path: str | Path) -> Iterator[BinaryIO]:
    with open(path, "rb") as raw:
        if raw.peek(len(_GZIP_MAGIC)).startswith(_GZIP_MAGIC):
            with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
                yield cast(BinaryIO, unzipped)
        else:
            yield raw


def read_lines(stream: BinaryIO) -> Iterator[tuple[int, str | JobError]]:
    """(line number, its text or why it cannot be read) per line; holds one line at a time, and
    reads a line over the limit in bounded pieces that it drops."""
    line_no = 0
    while True:
        try:
            line = stream.readline(_LINE_READ_LIMIT)
            too_long = len(line) == _LINE_READ_LIMIT and not line.endswith(b"\n")
            size = len(line) + (_skip_line(stream) if too_long else 0)
        except (OSError, EOFError, zlib.error) as exc:
            yield line_no + 1, JobError("file", None, f"cannot be read from here on: {exc}")
            return
        if not line:
            return
        line_no += 1
        if line_no == 1:
            line = line.removeprefix(_BOM)
        if too_long:
            yield (
                line_no,
                JobError("payload", f"{size} bytes", f"line exceeds the limit of {MAX_JOB_BYTES} bytes"),
            )
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = line[exc.start : exc.start + 1].hex()
            yield line_no, JobError("encoding", None, f"not valid UTF-8: byte {exc.start + 1} is 0x{bad}")
            continue
        yield line_no, text


def _skip_line(stream: BinaryIO) -> int:
    """Read past the next newline in bounded pieces; the number of bytes read."""
    skipped = 0
    while piece := stream.readline(_SKIP_PIECE_BYTES):
        skipped += len(piece)
        if piece.endswith(b"\n"):
            break
    return skipped


def output_record(result: Result) -> dict[str, Any]:
    """The output line (as a dict) for one result, in the format its job came in."""
    metadata = dict(result.metadata)
    format_info = metadata.pop(openai_batch.RESERVED_KEY, None)
    if isinstance(format_info, dict) and format_info.get("format") == "openai":
        return openai_batch.response_line(result, format_info, metadata)
    return {
        "id": result.id,
        "choices": [_native_choice(choice) for choice in result.choices],
        "usage": msgspec.to_builtins(result.usage),
        "metadata": metadata,
        "error": msgspec.to_builtins(result.error),
    }


def _native_choice(choice: Choice) -> dict[str, Any]:
    """A choice as a native output row holds it: ``logprobs`` only when the job asked for them."""
    record = msgspec.to_builtins(choice)
    if choice.logprobs is None:
        del record["logprobs"]
    return record


def output_line(result: Result, digest: str | None = None) -> bytes:
    """One output line; ``digest`` (producer.digest: the content of the job it answers) goes
    in ``job_digest``, which a later run reads to tell a changed row under the same id."""
    record = output_record(result)
    if digest is not None:
        record["job_digest"] = digest
    return msgspec.json.encode(record) + b"\n"


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
