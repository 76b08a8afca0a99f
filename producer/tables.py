"""Parquet output: the rows of a collect as a table, optionally joined to the input's columns.

collect always writes JSONL rows first (resumable, fsynced, rows replaced in place after a
requeue: producer.outfile); for ``-o out.parquet`` those rows live in ``out.parquet.rows.jsonl``
next to it, and ``out.parquet`` is written from them (temp file, then rename) at the end of
every collect. Columns of a result row:

    id             the job id (``custom_id`` of an OpenAI request)
    text           the first choice's text (null for an error row)
    texts          every choice's text (n > 1)
    finish_reason  the first choice's finish reason
    error          the error code (invalid_job, prompt_too_long, ...) or null
    error_message  what went wrong
    prompt_tokens, completion_tokens, cached_tokens
    metadata       the job's metadata as JSON text

Joined (``--join-input``): one row per input row, in input order, the input's columns first;
a result column whose name the input already uses is prefixed ``result_``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from producer.outfile import OutputFileError

RESULT_COLUMNS = (
    "id",
    "text",
    "texts",
    "finish_reason",
    "error",
    "error_message",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "metadata",
)


def is_parquet(path: str | Path) -> bool:
    return Path(path).name.lower().endswith((".parquet", ".pq"))


def rows_path(out: str | Path) -> Path:
    """Where collect keeps the JSONL rows of an output file: the file itself for JSONL."""
    out = Path(out)
    return out.with_name(out.name + ".rows.jsonl") if is_parquet(out) else out


def result_columns(record: dict[str, Any]) -> dict[str, Any]:
    """The table columns of one output row (native or OpenAI batch line)."""
    if "custom_id" in record:
        body = (record.get("response") or {}).get("body") or {}
        choices = [
            {
                "text": c.get("text", (c.get("message") or {}).get("content")),
                "finish_reason": c.get("finish_reason"),
            }
            for c in body.get("choices", [])
        ]
        usage, metadata = body.get("usage") or {}, body.get("metadata") or {}
        job_id = record["custom_id"] or record["id"]  # NOTE: a line with no readable custom_id
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    else:
        choices, usage, metadata, job_id = (
            record.get("choices") or [],
            record.get("usage") or {},
            record.get("metadata") or {},
            record["id"],
        )
        cached = usage.get("cached_tokens")
    error = record.get("error") or {}
    return {
        "id": job_id,
        "text": choices[0]["text"] if choices else None,
        "texts": [c["text"] for c in choices] if choices else None,
        "finish_reason": choices[0]["finish_reason"] if choices else None,
        "error": error.get("code"),
        "error_message": error.get("message"),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "cached_tokens": cached,
        "metadata": json.dumps(metadata) if metadata else None,
    }


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The table columns of each row of a JSONL output file, in file order."""
    if not Path(path).exists():
        return
    with open(path, "rb") as lines:
        for line in lines:
            if line.strip():
                yield result_columns(msgspec.json.decode(line))


def write_parquet(
    rows_file: str | Path, out: str | Path, inputs: Iterable[tuple[str, dict[str, Any]]] | None = None
) -> int:
    """Write ``out`` from the JSONL rows; with ``inputs`` ((job id, input columns) per input row,
    in order) one row per input row, joined; an input column of mixed types is written as
    text (``_typed``). Returns the number of table rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    results = {row["id"]: row for row in read_rows(rows_file)}
    if inputs is None:
        table_rows = list(results.values())
    else:
        table_rows = [_joined(columns, results.get(job_id), job_id) for job_id, columns in inputs]
    schema = None if table_rows else pa.schema([(name, pa.string()) for name in RESULT_COLUMNS])
    try:
        table = pa.Table.from_pylist(_typed(table_rows), schema=schema)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise OutputFileError(f"cannot write {out} as Parquet: {exc} (its rows are in {rows_file})") from None
    out = Path(out)
    fd, temp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    try:
        pq.write_table(table, temp)
        os.replace(temp, out)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return table.num_rows


def _typed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with each column that holds values of no one Arrow type (a JSONL input's
    ``1``, ``"two"``, missing) as text: strings kept, other values as their JSON text, null
    kept. Columns of one type are left as they are."""
    import pyarrow as pa

    names = list(dict.fromkeys(name for row in rows for name in row))
    mixed = []
    for name in names:
        try:
            pa.array([row.get(name) for row in rows])
        except (pa.ArrowException, ValueError, TypeError):
            mixed.append(name)
    if not mixed:
        return rows
    return [{**row, **{name: _text(row.get(name)) for name in mixed if name in row}} for row in rows]


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _joined(columns: dict[str, Any], result: dict[str, Any] | None, job_id: str) -> dict[str, Any]:
    row = dict(columns)
    for name in RESULT_COLUMNS:
        value = job_id if name == "id" else (result or {}).get(name)
        if name == "id" and row.get("id") is not None and str(row["id"]) == job_id:
            continue  # the input's own id column already says it
        row["result_" + name if name in columns else name] = value
    return row
