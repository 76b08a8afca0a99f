"""collect's spill: every result it reads, on local disk, until its row is written in order.

Workers finish jobs in any order (a routed queue drains its partitions one after another), and
the output file is written in input order. What arrives ahead of a job still missing waits here,
not in Redis and not in memory, so collect can trim every result it has read from Redis at once:
Redis holds only the results collect has not read yet. The spill is a SQLite database beside the
rows file (``OUT.spill``; ``OUT.parquet.rows.jsonl.spill``), one row per job id holding its
output line; a row leaves the spill once it is fsynced in the output file, and the file goes
when the spill is empty.

Exactly once, whatever the crash point (``kill -9`` included), because the spill is keyed by
job id and an id in the output file is never appended again:

    chunk read, not committed    in Redis only: read again by the next collect
    committed, not trimmed       in both: the stream's copy is skipped (the id is spilled)
    trimmed, not appended        in the spill only: written from there, in order
    appended, still in the spill in both: the spill's row is dropped when it is opened
    a replacement (a requeued dead letter's new result, ``replaces``) applied to the output,
    still in the spill           applied again when it is opened: the same line, no change
"""

from __future__ import annotations

import errno
import functools
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from producer.outfile import OutputFile

_CHUNK = 500  # ids per SELECT or DELETE (SQLite's bound on parameters is 999 in old builds)
F = TypeVar("F", bound=Callable[..., Any])


def _os_errors(method: F) -> F:
    """SQLite's errors (a full disk, a folder it cannot write) as an OSError naming the spill,
    which the commands report in one line like any other file error."""

    @functools.wraps(method)
    def wrapped(self: Spill, *args: Any) -> Any:
        try:
            return method(self, *args)
        except sqlite3.Error as exc:
            raise OSError(errno.EIO, f"the spill: {exc}", str(self.path)) from exc

    return wrapped  # type: ignore[return-value]


class SpillRow(NamedTuple):
    job_id: str
    line: bytes  # the output line, newline included
    code: str | None  # its error code (an error row), else None
    digest: str | None  # producer.digest of the job it answers
    replaces: bool  # the new row of an id whose row in the output file it replaces


def spill_path(rows_file: str | Path) -> Path:
    """Where the spill of a rows file lives: beside it."""
    rows_file = Path(rows_file)
    return rows_file.with_name(rows_file.name + ".spill")


class Spill:
    """The spill of one rows file, open (the caller holds the output file's lock). ``ids``:
    the ids it holds; ``failed``: of those, error rows. Rows put are durable after ``commit``."""

    @_os_errors
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, isolation_level=None)
        # NOTE: WAL with synchronous FULL: a commit is one fsync of the log, and survives power loss
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS rows (id TEXT PRIMARY KEY, line BLOB NOT NULL, code TEXT, "
            "digest TEXT, replaces INTEGER NOT NULL) WITHOUT ROWID"
        )
        self.ids: set[str] = set()
        self.failed: set[str] = set()
        for job_id, code in self._db.execute("SELECT id, code FROM rows WHERE replaces = 0"):
            self._note(job_id, code)
        self._open = False  # a transaction is open

    def _note(self, job_id: str, code: str | None) -> None:
        self.ids.add(job_id)
        if code is None:
            self.failed.discard(job_id)
        else:
            self.failed.add(job_id)

    def _begin(self) -> None:
        if not self._open:
            self._db.execute("BEGIN")
            self._open = True

    @_os_errors
    def put(self, rows: Iterable[SpillRow]) -> None:
        """Keep ``rows`` (a row for an id already held replaces it), durable at ``commit``."""
        rows = list(rows)
        if not rows:
            return
        self._begin()
        self._db.executemany("INSERT OR REPLACE INTO rows VALUES (?, ?, ?, ?, ?)", rows)
        for row in rows:
            if not row.replaces:
                self._note(row.job_id, row.code)

    @_os_errors
    def drop(self, ids: Iterable[str]) -> None:
        """Let go of the rows of ``ids`` (fsynced in the output file), at ``commit``."""
        ids = list(ids)
        if not ids:
            return
        self._begin()
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            self._db.execute(f"DELETE FROM rows WHERE id IN ({','.join('?' * len(chunk))})", chunk)
        self.ids.difference_update(ids)
        self.failed.difference_update(ids)

    @_os_errors
    def commit(self) -> None:
        if self._open:
            self._db.execute("COMMIT")
            self._open = False

    @_os_errors
    def rows(self, ids: list[str]) -> dict[str, SpillRow]:
        """The rows held for ``ids`` (those it has)."""
        found: dict[str, SpillRow] = {}
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            query = f"SELECT * FROM rows WHERE id IN ({','.join('?' * len(chunk))})"
            for job_id, line, code, digest, replaces in self._db.execute(query, chunk):
                found[job_id] = SpillRow(job_id, line, code, digest, bool(replaces))
        return found

    @_os_errors
    def replacements(self) -> list[SpillRow]:
        query = "SELECT * FROM rows WHERE replaces = 1"
        return [SpillRow(i, line, code, digest, True) for i, line, code, digest, _ in self._db.execute(query)]

    def settle(self, output: OutputFile) -> int:
        """Bring the spill and the output file to one state after a collect that stopped
        anywhere (module docstring): rows already appended are dropped, replacements are
        applied (returns how many), and one whose row is no longer in the file waits to be
        appended instead."""
        self.drop([i for i in self.ids if i in output.ids])
        pending = self.replacements()
        replaced = replace_rows(output, self, [row for row in pending if row.job_id in output.ids])
        self.put(row._replace(replaces=False) for row in pending if row.job_id not in output.ids)
        self.commit()
        return replaced

    @_os_errors
    def close(self) -> None:
        """Commit, close, and remove the file when it holds nothing."""
        self.commit()
        empty = self._db.execute("SELECT COUNT(*) FROM rows").fetchone()[0] == 0
        self._db.close()
        if empty:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def replace_rows(output: OutputFile, spill: Spill, rows: list[SpillRow]) -> int:
    """Swap the output rows of ``rows``' ids for their new lines (temp file, fsync, rename),
    then drop them from the spill; returns how many rows were replaced."""
    if not rows:
        return 0
    replaced = output.replace({row.job_id: (row.line, row.code, row.digest) for row in rows})
    spill.drop([row.job_id for row in rows])
    spill.commit()
    return replaced


def append_rows(output: OutputFile, spill: Spill, ids: list[str]) -> int:
    """Append the spilled rows of ``ids`` (in that order; ids it does not hold are passed
    over) to the output file, fsync it, then drop them from the spill; returns how many."""
    written: list[str] = []
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        found = spill.rows(chunk)
        for job_id in chunk:
            row = found.get(job_id)
            if row is not None and job_id not in output.ids:
                output.append(job_id, row.line, row.code, row.digest)
                written.append(job_id)
    output.sync()
    spill.drop(ids)
    spill.commit()
    return len(written)


def flush_spill(rows_file: str | Path) -> int:
    """Append everything a spill holds to its rows file (out of input order: ``run`` puts the
    file in order once every row is there) and remove the spill; returns the rows appended."""
    path = spill_path(rows_file)
    if not path.exists():
        return 0
    with OutputFile(rows_file) as output, Spill(path) as spill:
        spill.settle(output)
        return append_rows(output, spill, sorted(spill.ids))
