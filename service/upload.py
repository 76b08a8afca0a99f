"""``POST /v1/files``: a multipart body streamed into file storage, its lines checked on the way.

The body is parsed as it arrives (python-multipart's push parser); the ``file`` part's bytes go
to storage and to the line check (service.lines) a megabyte at a time, in a worker thread, so
memory holds one piece whatever the file's size, and the event loop keeps serving. The upload
stops at the first byte past the size limit (413) or the first line that cannot be a request
(400); what was stored is removed then.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import IO

import anyio.to_thread
from python_multipart.multipart import MultipartParser, parse_options_header

from service.errors import ApiError, bad_request
from service.lines import LineCheck
from service.storage import Storage

_PIECE_BYTES = 1 << 20  # file bytes handed to the worker thread at once
_MAX_FIELD_BYTES = 1024  # a form field other than the file (purpose)


@dataclass
class Upload:
    """What the body held: the form fields, the file's name and size, its lines' summary."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    size: int = 0
    check: LineCheck = field(default_factory=LineCheck)


class _Parts:
    """python-multipart's callbacks: headers, fields, and the file part's bytes queued."""

    def __init__(self, upload: Upload, max_bytes: int) -> None:
        self.upload = upload
        self.max_bytes = max_bytes
        self.name = ""
        self.is_file = False
        self.header = [b"", b""]
        self.disposition = b""
        self.value = bytearray()
        self.pending = bytearray()  # file bytes not yet stored
        self.files = 0

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self.begin,
            "on_part_data": self.data,
            "on_part_end": self.end,
            "on_header_field": lambda data, start, end: self._grow(0, data[start:end]),
            "on_header_value": lambda data, start, end: self._grow(1, data[start:end]),
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
        }

    def _grow(self, which: int, data: bytes) -> None:
        self.header[which] += data

    def begin(self) -> None:
        self.name, self.is_file, self.disposition = "", False, b""
        self.value.clear()

    def header_end(self) -> None:
        if self.header[0].lower() == b"content-disposition":
            self.disposition = self.header[1]
        self.header = [b"", b""]

    def headers_finished(self) -> None:
        _, options = parse_options_header(self.disposition)
        self.name = options.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in options:
            if self.name != "file" or self.files:
                raise bad_request("one file is expected, in the form field 'file'", param="file")
            self.files += 1
            self.is_file = True
            self.upload.filename = options[b"filename"].decode("utf-8", "replace")
            purpose = self.upload.fields.get("purpose")
            if purpose is not None:
                check_purpose(purpose)

    def data(self, data: bytes, start: int, end: int) -> None:
        piece = data[start:end]
        if not self.is_file:
            self.value += piece
            if len(self.value) > _MAX_FIELD_BYTES:
                raise bad_request(f"form field {self.name!r} is too long", param=self.name)
            return
        self.upload.size += len(piece)
        if self.upload.size > self.max_bytes:
            raise ApiError(
                413,
                f"the file is larger than this service's limit of {self.max_bytes} bytes",
                param="file",
                code="file_too_large",
            )
        self.pending += piece

    def end(self) -> None:
        if not self.is_file:
            self.upload.fields[self.name] = self.value.decode("utf-8", "replace")


def check_purpose(purpose: str) -> None:
    if purpose != "batch":
        raise bad_request(
            f"purpose {purpose!r} is not supported: radixq serve takes files for the Batch API "
            "(purpose 'batch')",
            param="purpose",
        )


async def receive(
    content_type: str, body: AsyncIterator[bytes], storage: Storage, name: str, max_bytes: int
) -> Upload:
    """Parse a multipart body into storage under ``name`` (removed again on any error)."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not content_type.startswith("multipart/form-data") or not boundary:
        raise bad_request("the body must be multipart/form-data with a 'file' and a 'purpose' field")
    upload = Upload()
    parts = _Parts(upload, max_bytes)
    parser = MultipartParser(boundary, parts.callbacks())  # type: ignore[arg-type]
    stored = False
    with storage.writer(name) as sink:

        def take(piece: bytes) -> None:
            upload.check.feed(piece)
            sink.write(piece)

        try:
            async for chunk in body:
                parser.write(chunk)
                if len(parts.pending) >= _PIECE_BYTES:
                    piece = bytes(parts.pending)
                    parts.pending.clear()
                    await anyio.to_thread.run_sync(take, piece)
            parser.finalize()
        except ValueError as exc:  # python-multipart's parse errors
            raise bad_request(f"the multipart body cannot be read: {exc}") from None
        if parts.pending:
            await anyio.to_thread.run_sync(take, bytes(parts.pending))
        if upload.filename is None:
            raise bad_request("a file is required (form field 'file')", param="file")
        check_purpose(upload.fields.get("purpose", ""))
        stored = True
    try:
        await anyio.to_thread.run_sync(_finish, upload.check, storage, name)
    except BaseException:
        if stored:
            storage.delete(name)
        raise
    return upload


def _finish(check: LineCheck, storage: Storage, name: str) -> None:
    reader: IO[bytes] | None = None
    try:
        reader = storage.reader(name)
        check.finish(reader)
    finally:
        if reader is not None:
            reader.close()
