"""JSONL output lines: a Result as the row it is written as (native, or an OpenAI batch
response line), and the ids an output file already holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from producer import openai_batch
from wire.schema import Choice, Result


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
