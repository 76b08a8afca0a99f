"""A batch's rows file (one row per request, as collect wrote it) split into the OpenAI output
file (rows with a response) and error file (rows with an error), in input order.

The rows carry the job ids the queue knows (``<batch id>/<custom_id>``, service.driver): each
row gets its own custom_id back, and the radixq codes OpenAI spells otherwise are renamed: a
request no worker serves the model of is ``model_not_found``; in an expired batch, a request
its expiry stopped is ``batch_expired`` (the queue's cancel wrote it). The split is a pure
function of the rows file, so a service that takes over a batch mid-split writes the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from service.storage import Storage

EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
_RENAMED = {"model_not_served": "model_not_found"}


@dataclass(frozen=True)
class Split:
    completed: int  # rows in the output file
    failed: int  # rows in the error file


def openai_row(row: dict[str, Any], prefix: str, expired: bool) -> dict[str, Any]:
    """One collect row as the OpenAI batch line of its request."""
    row.pop("job_digest", None)
    for key in ("custom_id", "id"):
        value = row.get(key)
        if isinstance(value, str):
            row[key] = value.removeprefix(prefix)
    error = row.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        if expired and code == "batch_cancelled":
            error["code"], error["message"] = "batch_expired", EXPIRED_MESSAGE
        else:
            error["code"] = _RENAMED.get(code, code) if isinstance(code, str) else code
            if isinstance(error.get("message"), str):
                error["message"] = error["message"].replace(prefix, "")
    return row


def split_rows(
    rows_path: Path, storage: Storage, output_name: str, error_name: str, prefix: str, expired: bool
) -> Split:
    """Write ``output_name`` and ``error_name`` into storage from the rows file; the counts."""
    completed = failed = 0
    with (
        open(rows_path, "rb") as rows,
        storage.writer(output_name) as output,
        storage.writer(error_name) as errors,
    ):
        for line in rows:
            if not line.strip():
                continue
            row = openai_row(msgspec.json.decode(line), prefix, expired)
            sink: IO[bytes] = errors if row.get("error") is not None else output
            sink.write(msgspec.json.encode(row) + b"\n")
            if sink is errors:
                failed += 1
            else:
                completed += 1
    return Split(completed, failed)
