"""Dataset files in: JSONL (optionally gzip), Parquet and CSV rows -> Jobs, through a column
mapping and an optional prompt template.

With no mapping, a JSONL file is read as job lines (producer.jsonl) and a Parquet or CSV row
is read the same way: the columns ``id``, ``prompt``, ``messages``, ``input_ids``,
``metadata`` and the sampling fields (``max_tokens``, ``temperature``, ...) are the job's,
others are ignored (kept for ``--join-input``). A mapping names the columns instead:

    prompt_column    the prompt text             template   "Q: {question}\\nA:" filled from
    messages_column  a chat (list of messages,              the row's columns (a prompt)
                     or its JSON text in CSV)
    id_column        the job id (any scalar, as text); without it an id is derived from the
                     row number and content, so the same file gives the same ids every time

A row that cannot be a job (a missing column value, a template naming an unknown column, an
invalid sampling value) is rejected with its row number, like a bad JSONL line: it gets an
``invalid_job`` error row in the output.
"""

from __future__ import annotations

import csv
import io
import json
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from producer.input_lines import open_binary, read_lines
from producer.input_rows import InputFile, Rejected, derive_id
from producer.jsonl import SAMPLING_FIELDS, iter_jobs, json_error
from wire.schema import Job, JobError, validation_error

_JOB_COLUMNS = ("id", "prompt", "messages", "input_ids", "metadata")
_BATCH_ROWS = 1024  # Parquet rows read at a time


@dataclass(frozen=True)
class ColumnMapping:
    """Which columns make a job; all None: the native column names (module docstring)."""

    prompt_column: str | None = None
    messages_column: str | None = None
    id_column: str | None = None
    template: str | None = None

    @property
    def given(self) -> bool:
        return any(
            v is not None for v in (self.prompt_column, self.messages_column, self.id_column, self.template)
        )

    def check(self) -> None:
        """Raises ValueError for a mapping that cannot make a job."""
        sources = [self.prompt_column, self.messages_column, self.template]
        if sum(source is not None for source in sources) > 1:
            raise ValueError("give one of --prompt-column, --messages-column and --template")


NATIVE_COLUMNS = ColumnMapping()  # no mapping: the native column names


def file_format(path: str | Path) -> str:
    """parquet, csv or jsonl, by the file name (``.csv.gz`` is csv, anything else jsonl)."""
    name = Path(path).name.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    return "jsonl"


def read_input(path: str | Path, mapping: ColumnMapping = NATIVE_COLUMNS) -> InputFile:
    """Every row of a dataset file as a Job or a rejected row, in file order."""
    parsed = InputFile()
    for _ in iter_input(path, mapping, parsed):
        pass
    return parsed


def iter_input(path: str | Path, mapping: ColumnMapping, parsed: InputFile) -> Iterator[Job | Rejected]:
    """read_input, one row at a time as the file is read (in batches: memory does not grow with
    the file); ``parsed`` counts the rows and keeps what its ``keep_rows`` says. Raises OSError
    or ValueError (pyarrow: not a Parquet/CSV file) when the file cannot be read."""
    mapping.check()
    kind = file_format(path)
    if kind == "jsonl" and not mapping.given:
        yield from iter_jobs(path, parsed)
        return
    unit = "line" if kind == "jsonl" else "row"
    for row_no, record in read_records(path):
        if isinstance(record, JobError):
            yield parsed.reject(row_no, str(record), None, None, unit=unit)
            continue
        try:
            job = row_job(record, row_no, mapping)
        except JobError as exc:
            job_id = _id_text(record.get(mapping.id_column or "id"))
            yield parsed.reject(row_no, str(exc), job_id, None, unit=unit)
            continue
        yield parsed.add_job(job, row_no, unit=unit)


def input_columns(path: str | Path, parsed: InputFile) -> list[tuple[str, dict[str, Any]]]:
    """(job id of its output row, its columns) per input row, in order: what a joined output
    pairs with the results (an unreadable row has no columns)."""
    records = (record for _, record in read_records(path))
    return [
        (row.id if isinstance(row, Job) else row.job_id, record if isinstance(record, dict) else {})
        for row, record in zip(parsed.rows, records, strict=True)
    ]


def read_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | JobError]]:
    """(row number from 1, the row as a dict of columns, or why it is unreadable)."""
    kind = file_format(path)
    if kind == "jsonl":
        yield from _jsonl_records(path)
        return
    if kind == "parquet":
        import pyarrow.parquet as pq

        row_no = 0
        with pq.ParquetFile(path) as table:
            for batch in table.iter_batches(batch_size=_BATCH_ROWS):
                for record in batch.to_pylist():
                    row_no += 1
                    yield row_no, record
        return
    yield from _csv_records(path)


def _csv_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | JobError]]:
    """A CSV file's rows in batches; a row with more or fewer cells than the header is that
    row's error, not the file's (pyarrow leaves it out of its batch: it is put back in its
    place here)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    ragged: dict[int, JobError] = {}

    def ragged_row(row: Any) -> str:
        # NOTE: pyarrow numbers the rows, header included (single-threaded, so in order); it
        # calls this while parsing a block, before the batch of that block is handed over
        cells = f"{row.actual_columns} cell" + ("s" if row.actual_columns != 1 else "")
        ragged[row.number - 1] = JobError("csv", None, f"has {cells}, the header has {row.expected_columns}")
        return "skip"

    # NOTE: every CSV column as bytes, decoded row by row (_csv_row): a cell that is not UTF-8
    # is its row's error, not the file's; as text, an id "007" stays "007" and numbers
    # (max_tokens) are converted by the job's own validation.
    types = {name: pa.binary() for name in _csv_header(path)}
    reader = pacsv.open_csv(
        path,
        read_options=pacsv.ReadOptions(use_threads=False),
        parse_options=pacsv.ParseOptions(invalid_row_handler=ragged_row),
        convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True),
    )
    row_no = 1
    with reader:
        for batch in reader:
            for cells in batch.to_pylist():
                while row_no in ragged:
                    yield row_no, ragged.pop(row_no)
                    row_no += 1
                yield row_no, _csv_row(cells)
                row_no += 1
    for number in sorted(ragged):
        yield number, ragged[number]


def _csv_row(cells: dict[str, bytes | None]) -> dict[str, Any] | JobError:
    """A CSV row's cells as text, or the error naming the first cell that is not UTF-8."""
    row: dict[str, Any] = {}
    for column, cell in cells.items():
        try:
            row[column] = None if cell is None else cell.decode("utf-8")
        except UnicodeDecodeError as exc:
            return JobError(column, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})")
    return row


def _csv_header(path: str | Path) -> list[str]:
    with open_binary(path) as stream:
        first = stream.readline().decode("utf-8-sig")
    return next(csv.reader(io.StringIO(first)), [])


def _jsonl_records(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | JobError]]:
    with open_binary(path) as stream:
        for line_no, text in read_lines(stream):
            if isinstance(text, JobError):
                yield line_no, text
                continue
            if not text.strip():
                continue
            try:
                record = msgspec.json.decode(text)
            except (msgspec.DecodeError, RecursionError) as exc:
                yield line_no, json_error(text, exc)
                continue
            if not isinstance(record, dict):
                yield line_no, JobError("json", None, f"must be a JSON object, got {type(record).__name__}")
                continue
            yield line_no, record


def row_job(record: dict[str, Any], row_no: int, mapping: ColumnMapping) -> Job:
    """One row as a Job; raises JobError naming the column and why."""
    fields = {k: record[k] for k in (*_JOB_COLUMNS, *SAMPLING_FIELDS) if record.get(k) is not None}
    if mapping.id_column is not None:
        fields["id"] = _column(record, mapping.id_column)
    if "id" in fields:
        fields["id"] = _id_text(fields["id"])
    if mapping.template is not None or mapping.prompt_column is not None:
        fields.pop("messages", None), fields.pop("input_ids", None)
        fields["prompt"] = (
            fill_template(mapping.template, record)
            if mapping.template is not None
            else _column(record, mapping.prompt_column or "")
        )
    elif mapping.messages_column is not None:
        fields.pop("prompt", None), fields.pop("input_ids", None)
        fields["messages"] = _column(record, mapping.messages_column)
    for key in ("messages", "input_ids", "metadata", "stop", "stop_token_ids"):
        if isinstance(fields.get(key), str) and key != "stop":
            fields[key] = _json_cell(key, fields[key])  # CSV: a structured cell is its JSON text
    if "id" not in fields:
        fields["id"] = derive_id(json.dumps(record, sort_keys=True, default=str), row_no)
    sampling = {key: fields.pop(key) for key in list(fields) if key in SAMPLING_FIELDS}
    try:
        return msgspec.convert({**fields, "sampling": sampling}, Job, strict=False)
    except msgspec.ValidationError as exc:
        error = validation_error(exc, fields["id"] if isinstance(fields["id"], str) else None)
        raise JobError(
            error.field.removeprefix("sampling."), error.value, error.reason, error.job_id
        ) from None


def fill_template(template: str, record: dict[str, Any]) -> str:
    """``template`` with ``{column}`` fields filled from the row (``{{``/``}}`` are braces).

    A field names a column verbatim (``{user.name}`` is the column "user.name": no attribute
    or item of a value is reachable); a format spec applies to the value (``{n:>4}``). A row
    whose value a field cannot take is that row's error, never the file's."""
    try:
        return _ROW_FORMATTER.vformat(template, (), _Columns(record))
    except JobError:
        raise
    except KeyError as exc:
        raise JobError("template", f"{{{exc.args[0]}}}", "names no column of this file") from None
    except Exception as exc:  # NOTE: a format spec meeting this row's value (TypeError, ValueError, ...)
        raise JobError("template", None, f"not a valid template for this row: {exc}") from None


class _RowFormatter(string.Formatter):
    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        return self.get_value(field_name, args, kwargs), field_name

    def get_value(self, key: int | str, args: Any, kwargs: Any) -> Any:
        if isinstance(key, int) or key.isdigit():
            raise ValueError("Format string contains positional fields; name a column: {column}")
        return kwargs[key]


_ROW_FORMATTER = _RowFormatter()


class _Columns(dict):  # type: ignore[type-arg]
    """A row for the template: a missing or empty value is an error, not the text "None" or a
    prompt with a hole where the question should be."""

    def __missing__(self, key: str) -> Any:
        raise KeyError(key)

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise JobError(key, value, "is empty in this row (the template needs it)")
        return value


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape_template(text: str) -> str:
    """A template as typed in a shell, where double quotes keep ``\\n`` as two characters:
    ``\\n`` is a newline, ``\\t`` a tab, ``\\\\`` a backslash; any other backslash stays."""
    return re.sub(r"\\([nt\\])", lambda match: _ESCAPES[match.group(1)], text)


def _column(record: dict[str, Any], name: str) -> Any:
    if name not in record:
        raise JobError(name, None, "no such column in this file")
    if record[name] is None:
        raise JobError(name, None, "is empty in this row")
    return record[name]


def _id_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, str) else str(value)


def _json_cell(column: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise JobError(column, None, f"not valid JSON text: {exc}") from None
