"""The lines of an uploaded batch file, checked as they stream in (``LineCheck.feed``).

Each line is validated as ``radixq enqueue`` validates it (producer.jsonl.parse_line). Two
kinds of trouble, told apart:

- the line is not an OpenAI batch request line at all (not UTF-8, not a JSON object, no
  ``custom_id``, a ``method`` other than POST, a ``url`` radixq does not serve, a custom_id seen
  on an earlier line, over the line limit): its output row could not name its request, so the
  upload is refused (400) with the line number and why;
- the request itself is not runnable (a body field radixq rejects, a value out of range): the
  line is accepted and counted in ``invalid``; when its batch runs it gets an ``invalid_job`` row
  in the error file, as every other line gets its row.

Memory is bounded whatever the file's size: one line at a time, and 8 bytes per line for the
duplicate check (a 64-bit hash of each custom_id, kept in 256 arrays by its top byte and sorted
one array at a time at the end, so the sort holds 1/256 of them as Python ints; a repeated hash
is confirmed on the stored bytes, ``duplicate``, before it is reported).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from typing import IO, Any

import msgspec

from producer.jsonl import parse_line
from producer.openai_request import CHAT_URL, COMPLETIONS_URL
from service.errors import ApiError, bad_request
from wire.schema import MAX_ID_CHARS, MAX_JOB_BYTES, JobError

# A batch's job ids are ``<batch id>/<custom_id>`` (service.driver): the custom_id leaves room.
BATCH_PREFIX_CHARS = 32
MAX_CUSTOM_ID_CHARS = MAX_ID_CHARS - BATCH_PREFIX_CHARS
MAX_MODELS = 64  # distinct models a file record keeps (more: the check at create is skipped)
_BOM = b"\xef\xbb\xbf"
_BUCKETS = 256  # by a hash's top byte


def _id_hash(custom_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(custom_id.encode(), digest_size=8).digest(), "little")


def _refuse(line_no: int, reason: str, code: str) -> ApiError:
    return bad_request(f"line {line_no}: {reason}", param="file", code=code)


class LineCheck:
    def __init__(self) -> None:
        self.lines = 0  # request lines (blank lines are not counted)
        self.invalid = 0  # of which: requests that will get an invalid_job row
        self.models: set[str] = set()
        self.too_many_models = False
        self.urls: set[str] = set()
        self.first_error: str | None = None  # the first invalid request, said in the upload's log
        self._line_no = 0
        self._buffer = bytearray()
        self._hashes = [array("Q") for _ in range(_BUCKETS)]

    def feed(self, chunk: bytes) -> None:
        """Check the lines ``chunk`` completes; ApiError (400) on a line that cannot be a request."""
        self._buffer += chunk
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end < 0:
                break
            self._line(bytes(self._buffer[start:end]))
            start = end + 1
        del self._buffer[:start]
        if len(self._buffer) > MAX_JOB_BYTES + len(_BOM) + 1:
            raise _refuse(
                self._line_no + 1, f"longer than the limit of {MAX_JOB_BYTES} bytes", "line_too_long"
            )

    def finish(self, stored: IO[bytes] | None = None) -> None:
        """The last line (without its newline), then the duplicate check (``stored``: the file's
        bytes, read again only when two custom_ids share a hash). ApiError as ``feed``."""
        if self._buffer:
            self._line(bytes(self._buffer))
            self._buffer.clear()
        if self.lines == 0:
            raise bad_request("the file holds no request lines", param="file", code="empty_file")
        repeated: set[int] = set()
        for bucket in self._hashes:
            ordered = sorted(bucket)
            repeated.update(a for a, b in zip(ordered, ordered[1:], strict=False) if a == b)
        if repeated and stored is not None:
            found = duplicate(stored, repeated)
            if found is not None:
                custom_id, first, second = found
                raise _refuse(
                    second, f"custom_id {custom_id!r} is a duplicate of line {first}'s", "duplicate_custom_id"
                )

    def _line(self, raw: bytes) -> None:
        self._line_no += 1
        line_no = self._line_no
        if line_no == 1:
            raw = raw.removeprefix(_BOM)
        if not raw.strip():
            return
        if len(raw.rstrip(b"\r")) > MAX_JOB_BYTES:
            raise _refuse(line_no, f"longer than the limit of {MAX_JOB_BYTES} bytes", "line_too_long")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _refuse(line_no, f"not valid UTF-8 (byte {exc.start + 1})", "invalid_json_line") from None
        request = _request(text, line_no)
        self.lines += 1
        custom_id = request["custom_id"]
        hashed = _id_hash(custom_id)
        self._hashes[hashed >> 56].append(hashed)
        self.urls.add(request["url"])
        body = request.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model and not self.too_many_models:
            self.models.add(model)
            if len(self.models) > MAX_MODELS:
                self.too_many_models, self.models = True, set()
        try:
            parse_line(text, line_no)
        except JobError as exc:
            self.invalid += 1
            if self.first_error is None:
                self.first_error = f"line {line_no}: {exc}"


def _request(text: str, line_no: int) -> dict[str, Any]:
    """The line as an OpenAI request line, as far as its row needs it; ApiError when it is not one."""
    try:
        raw = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _refuse(line_no, f"not valid JSON ({exc})", "invalid_json_line") from None
    if not isinstance(raw, dict):
        raise _refuse(line_no, f"must be a JSON object, not {type(raw).__name__}", "invalid_json_line")
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _refuse(line_no, "custom_id must be a non-empty string", "missing_custom_id")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise _refuse(
            line_no, f"custom_id is longer than {MAX_CUSTOM_ID_CHARS} characters", "invalid_custom_id"
        )
    if raw.get("method", "POST") != "POST":
        raise _refuse(line_no, f"method {raw.get('method')!r}: only POST is supported", "invalid_method")
    if raw.get("url") not in (CHAT_URL, COMPLETIONS_URL):
        reason = f"url {raw.get('url')!r}: must be {CHAT_URL} or {COMPLETIONS_URL}"
        raise _refuse(line_no, reason, "invalid_url")
    return raw


def _custom_ids(stored: IO[bytes]) -> Iterator[tuple[int, str]]:
    for line_no, raw in enumerate(stored, start=1):
        if raw.strip():
            try:
                custom_id = msgspec.json.decode(raw).get("custom_id")
            except (msgspec.DecodeError, AttributeError, RecursionError):
                continue
            if isinstance(custom_id, str):
                yield line_no, custom_id


def duplicate(stored: IO[bytes], hashes: set[int]) -> tuple[str, int, int] | None:
    """(custom_id, its first line, the repeating line) of the first custom_id in ``stored`` seen
    twice among those whose hash is in ``hashes``; None: the hashes only collided."""
    first: dict[str, int] = {}
    for line_no, custom_id in _custom_ids(stored):
        if _id_hash(custom_id) in hashes:
            if custom_id in first:
                return custom_id, first[custom_id], line_no
            first[custom_id] = line_no
    return None
