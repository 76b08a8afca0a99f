"""Raw JSONL input lines: a file opened as bytes (gzip told by its magic bytes), read one line
at a time with a UTF-8 byte order mark on the first line skipped and a line over the size limit
dropped in bounded pieces. Validating a line is producer.jsonl's.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

from wire.schema import MAX_JOB_BYTES, JobError

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_LINE_READ_LIMIT = MAX_JOB_BYTES + len(_BOM) + 2  # the longest acceptable line with its BOM and CRLF
_SKIP_PIECE_BYTES = 1 << 16


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
