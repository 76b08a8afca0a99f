"""The ids a JSONL input names, read without validating its lines: what tells enqueue that no
row of a file can have changed since it was enqueued, without parsing the file twice.

An enqueue stops before writing anything when an id of the file was enqueued before with other
content (producer.digest). Only a row under an id the line itself names (``id``, or an OpenAI
request's ``custom_id``) can be such a row: an id derived from a line (producer.input_rows's
``derive_id``) is a hash of its line number and text, so the same derived id is the same line.
When the queue holds a digest for none of the named ids, no row has changed; the full check
(every line parsed, every digest compared) is needed only when it holds one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from producer.input_lines import open_binary, read_lines


class Unreadable(Exception):
    """A line this scan cannot read as a JSON object: the full check decides."""


class _Named(msgspec.Struct):
    id: Any = None
    custom_id: Any = None


_decoder = msgspec.json.Decoder(_Named)


def named_ids(path: str | Path) -> Iterator[str]:
    """Every string ``id`` and ``custom_id`` of the lines of a JSONL file (plain or gzip), in
    line order; lines that are not text (a rejected row gets a derived id) are passed over.
    Raises Unreadable at the first line that is not a JSON object."""
    with open_binary(path) as stream:
        for _, text in read_lines(stream):
            if not isinstance(text, str) or not text.strip():
                continue
            try:
                named = _decoder.decode(text)
            except Exception as exc:  # NOTE: not an object, or nested too deep to skip over
                raise Unreadable(str(exc)) from None
            for value in (named.id, named.custom_id):
                if isinstance(value, str):
                    yield value
