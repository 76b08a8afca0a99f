"""collect's output file: resumed where it stopped, appended and fsynced, rows replaced in place.

One JSON line per job id (``custom_id`` for OpenAI batch rows, else ``id``); a row whose
``error`` is an object is an error row. Results may be trimmed from Redis only after
``sync`` returned: from then on the file is their only copy. An open OutputFile holds the
file's lock (producer.outlock): a second writer is refused, naming the first.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import msgspec

from producer.digest import REJECTED
from producer.input_rows import Rejected
from producer.outlock import output_lock
from producer.output_lines import output_line
from wire.schema import decode_result, error_result


class OutputFileError(Exception):
    """The output file holds something other than radixq rows; ``str()`` is the one line."""


class _Row(msgspec.Struct):
    id: str | None = None
    custom_id: str | None = None
    error: Any = None
    job_digest: str | None = None


_row_decoder = msgspec.json.Decoder(_Row)


class RowKey(NamedTuple):
    job_id: str
    code: str | None  # the error code of an error row, else None
    digest: str | None  # producer.digest of the job it answers (None: a row written before digests)


def row_key(line: bytes) -> RowKey:
    """What identifies one output line."""
    row = _row_decoder.decode(line)
    job_id = row.custom_id or row.id
    if job_id is None:
        raise ValueError(f"output row without id: {line[:200]!r}")
    error = row.error
    code = str(error.get("code") or "error") if isinstance(error, dict) else None
    return RowKey(job_id, code, row.job_digest if isinstance(row.job_digest, str) else None)


def row_keys(path: str | Path) -> list[RowKey]:
    """The key of every row of an output file (none when there is no file)."""
    path = Path(path)
    if not path.exists():
        return []
    with open(path, "rb") as lines:
        return [row_key(line) for line in lines if line.strip()]


def result_line(job_id: str, raw: bytes, digest: str | None = None) -> tuple[bytes, str | None]:
    """The output line of one result as stored in Redis (with the digest of its job), and its
    error code; a result that cannot be decoded becomes that job's ``internal`` error row."""
    try:
        result = decode_result(raw)
    except msgspec.DecodeError as exc:
        result = error_result(job_id, "internal", f"result in Redis could not be decoded: {exc}")
    return output_line(result, digest), result.error.code if result.error is not None else None


def rejected_line(row: Rejected) -> bytes:
    """The ``invalid_job`` row of a row rejected before it could run."""
    return output_line(row.error_result(), REJECTED)


def write_rejected(path: str | Path, rejected: list[Rejected]) -> None:
    """The errors file (``--errors``): one ``invalid_job`` row per rejected input row, in input
    order, written whole (temp file, fsync, rename) every time: the same input gives the same file."""
    write_atomically(Path(path), (rejected_line(row) for row in rejected))


def write_atomically(path: Path, lines: Iterable[bytes]) -> None:
    """Write ``path`` whole from ``lines``: a temp file beside it, fsync, rename, fsync of the
    folder. A crash leaves the old file or the new one, never a mix."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with naming(path), os.fdopen(fd, "wb") as out:
            out.writelines(lines)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
        _fsync_dir(path.parent)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError without a file name (a write that found the disk full: "No space left on
    device") names ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise


def os_error_line(exc: OSError) -> str:
    """``FILE: reason`` (or the reason alone) for an error line."""
    return f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")


def cut_torn_line(path: Path) -> None:
    """Drop a last line without its newline (a write cut short by a crash)."""
    size = path.stat().st_size
    with open(path, "r+b") as out:
        if size == 0:
            return
        out.seek(size - 1)
        if out.read(1) == b"\n":
            return
        end = size
        while end > 0:
            start = max(0, end - 65536)
            out.seek(start)
            newline = out.read(end - start).rfind(b"\n")
            if newline >= 0:
                out.truncate(start + newline + 1)
                return
            end = start
        out.truncate(0)


class OutputFile:
    """The output file, open for appending and locked. ``ids``: every id with a row;
    ``errors``: id -> error code of its row, for error rows; ``digests``: id -> the digest its
    row carries; ``duplicates``: ids found on more than one row when it was opened (written by
    concurrent collects before the lock existed). Holds no row payloads. Raises
    producer.outlock.OutputBusy when another process writes it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.ids: set[str] = set()
        self.order: list[str] = []  # the ids of its rows, in file order
        self.errors: dict[str, str] = {}
        self.digests: dict[str, str] = {}
        self.duplicates: list[str] = []
        self._stack = ExitStack()
        self._stack.enter_context(output_lock(self.path))
        try:
            if self.path.exists():
                self._load()
            self._sink: BinaryIO = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        except BaseException:
            self._stack.close()
            raise
        self._unsynced = False

    def _load(self) -> None:
        cut_torn_line(self.path)
        with open(self.path, "rb") as rows:
            for line_no, line in enumerate(rows, start=1):
                if line.strip():
                    try:
                        key = row_key(line)
                    except (msgspec.DecodeError, ValueError) as exc:
                        raise OutputFileError(
                            f"{self.path}: line {line_no} is not a radixq output row ({exc}); "
                            "collect into a new file or remove that line"
                        ) from None
                    if key.job_id in self.ids:
                        self.duplicates.append(key.job_id)
                    else:
                        self.order.append(key.job_id)
                    self._note(*key)

    def _note(self, job_id: str, code: str | None, digest: str | None = None) -> None:
        self.ids.add(job_id)
        if code is None:
            self.errors.pop(job_id, None)
        else:
            self.errors[job_id] = code
        if digest is None:
            self.digests.pop(job_id, None)
        else:
            self.digests[job_id] = digest

    def append(self, job_id: str, line: bytes, code: str | None, digest: str | None = None) -> None:
        with naming(self.path):
            self._sink.write(line)
        if job_id not in self.ids:
            self.order.append(job_id)
        self._note(job_id, code, digest)
        self._unsynced = True

    def sync(self) -> None:
        """Flush and fsync what was appended."""
        if self._unsynced:
            with naming(self.path):
                self._sink.flush()
                os.fsync(self._sink.fileno())
            self._unsynced = False

    def replace(self, rows: dict[str, tuple[bytes, str | None, str | None]]) -> int:
        """Rewrite the file with the rows of the given ids swapped for new lines (id -> (line,
        error code, digest)), every other row and the order kept: temp file, fsync, rename.
        Returns how many rows were replaced."""
        self.sync()
        self._sink.close()
        replaced = 0

        def lines(old: BinaryIO) -> Iterator[bytes]:
            nonlocal replaced
            for line in old:
                job_id = row_key(line).job_id if line.strip() else None
                if job_id is not None and job_id in rows:
                    line, code, digest = rows[job_id]
                    self._note(job_id, code, digest)
                    replaced += 1
                yield line

        try:
            with open(self.path, "rb") as old:
                write_atomically(self.path, lines(old))
        finally:
            self._sink = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        return replaced

    def reorder(self, order: list[str], others_first: bool = False) -> None:
        """Rewrite the file so its rows follow ``order`` (producer.rewrite.put_in_order)."""
        from producer.rewrite import put_in_order, rank_of

        self.sync()
        self._sink.close()
        try:
            if put_in_order(self.path, order, others_first):
                self.order.sort(key=rank_of(order, others_first))
        finally:
            self._sink = open(self.path, "ab")  # noqa: SIM115 - closed by close()

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._sink.close()
            self._stack.close()

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
