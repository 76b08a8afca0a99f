"""Whole-file rewrites of an output file, once its rows are all there: into input order, and
its error rows moved to the ``--errors`` file.

collect appends rows as results come (producer.collector): in order up to the first job still
missing, then, when it stops early, the results that had arrived behind it. A later collect
appends the missing ones, so a resumed file can end out of order; ``put_in_order`` rewrites it
(temp file, fsync, rename: producer.outfile.write_atomically) once every row is there. Both
rewrites hold an index of (id, offset, length) per row in memory, never the rows themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from producer.input_rows import Rejected
from producer.outfile import rejected_line, row_key, write_atomically

_Row = tuple[str, str | None, int, int]  # id, error code (None: no error), offset, length


def _index(path: Path) -> list[_Row]:
    rows: list[_Row] = []
    if not path.exists():
        return rows
    with open(path, "rb") as lines:
        offset = 0
        for line in lines:
            if line.strip():
                key = row_key(line)
                rows.append((key.job_id, key.code, offset, len(line)))
            offset += len(line)
    return rows


def rank_of(order: Sequence[str], others_first: bool = False) -> Callable[[str], int]:
    """A sort key of ids: their place in ``order``; ids not in it after (or, with
    ``others_first``, before) all of them, all in one place (a stable sort keeps them as they were)."""
    rank = {job_id: place for place, job_id in enumerate(order)}
    other = -1 if others_first else len(rank)
    return lambda job_id: rank.get(job_id, other)


def _ranked(rows: list[_Row], order: Sequence[str], others_first: bool = False) -> list[_Row]:
    """``rows`` sorted by their id's place in ``order`` (rank_of)."""
    key = rank_of(order, others_first)
    return sorted(rows, key=lambda row: key(row[0]))  # NOTE: a stable sort


def _copied(source: BinaryIO, rows: list[_Row]) -> Iterator[bytes]:
    for _, _, offset, length in rows:
        source.seek(offset)
        yield source.read(length)


def put_in_order(path: Path, order: Sequence[str], others_first: bool = False) -> bool:
    """Rewrite ``path`` so its rows follow ``order`` (rows of other ids after them, or before
    them with ``others_first``: the rows of a prefix of the order that Redis forgot,
    producer.forget, in their order); nothing when they already do. True when it was rewritten."""
    rows = _index(path)
    ranked = _ranked(rows, order, others_first)
    if ranked == rows:
        return False
    with open(path, "rb") as source:
        write_atomically(path, _copied(source, ranked))
    return True


def split_errors(path: Path, errors_path: Path, rejected: list[Rejected], order: Sequence[str]) -> int:
    """``--errors``: the errors file gets every error row of this input in input order (the
    rows rejected before they could run, written anew, and the run-time error rows moved out of
    ``path``, including those an earlier run moved there); ``path`` keeps the other rows. An
    id with a row without error in ``path`` leaves the errors file. Returns the rows moved.

    NOTE: the errors file is written first, so a crash between the two renames leaves a row
    in both files, never in neither; the next run's split moves it again."""
    rows = _index(path)
    ok = {row[0] for row in rows if row[1] is None}
    moved = [row for row in rows if row[1] is not None]
    fresh = {row.job_id: rejected_line(row) for row in rejected}
    earlier = [row for row in _index(errors_path) if row[0] not in fresh and row[0] not in ok]
    moved_ids = {row[0] for row in moved}
    earlier = [row for row in earlier if row[0] not in moved_ids]

    def error_lines(kept: BinaryIO | None, source: BinaryIO) -> Iterator[bytes]:
        entries: list[tuple[str, bytes | tuple[BinaryIO, _Row]]] = [(i, line) for i, line in fresh.items()]
        if kept is not None:
            entries += [(row[0], (kept, row)) for row in earlier]
        entries += [(row[0], (source, row)) for row in moved]
        rank = {job_id: place for place, job_id in enumerate(order)}
        for _, entry in sorted(entries, key=lambda item: rank.get(item[0], len(rank))):
            if isinstance(entry, bytes):
                yield entry
            else:
                yield from _copied(entry[0], [entry[1]])

    with open(path, "ab+") as source:
        if errors_path.exists():
            with open(errors_path, "rb") as kept:
                write_atomically(errors_path, error_lines(kept, source))
        else:
            write_atomically(errors_path, error_lines(None, source))
        if moved:
            write_atomically(path, _copied(source, [row for row in rows if row[1] is None]))
    return len(moved)
